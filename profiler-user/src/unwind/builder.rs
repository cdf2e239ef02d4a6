//! Builds unwind tables on threads of their own, so that no caller waits for one: a 430 MB
//! library (PyTorch's `libtorch_cpu.so`, 2.6 million rows) takes about half a second, and a
//! process like PyTorch maps seventy objects. The caller submits jobs for an owner (the user a
//! run is for), asks for the sampled ones first, and installs finished tables when it next
//! looks (see [`super::UnwindMaps`]).
//!
//! The build threads are shared by every run of a kernel program, so they are shared fairly:
//! each owner has a queue of its own (sampled objects first, then the smallest), the owner
//! whose builds have cost the least CPU goes next (owners that used as much, in turn), and an
//! owner runs one build at a time. A user whose process maps many large or costly objects
//! (up to [`super::table::BUILD_CPU_BUDGET`] each) then delays another user's tables by at
//! most the build in progress on one thread, while the other thread serves the other user:
//! served in one queue smallest first, a user's 1 MB objects that each cost the 5 s budget
//! kept another user's libc table waiting behind all of them.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{
        mpsc::{self, Receiver, Sender},
        Arc, Condvar, Mutex,
    },
    time::{Duration, Instant},
};

use super::{
    cache::TableCache,
    file_key::FileKey,
    table::{CfiInputs, UnwindTable},
};

/// Whom a build is for: the uid of the run's owner (0 for root and the command line, which
/// count as one owner).
pub(crate) type Owner = u32;

/// Threads that build tables: two, so that one owner's build in progress (up to
/// [`super::table::BUILD_CPU_BUDGET`] of CPU) never holds up every other owner, and no more,
/// since an owner runs one build at a time and each build thread costs a core while it works.
const BUILD_THREADS: usize = 2;

/// How much nicer than the rest of the process background build threads run (see
/// [`BuildPriority::Background`]).
const BUILD_NICENESS: i32 = 5;

/// How much less nice than the rest of the process a command-line run's build threads run,
/// where the system allows it (root, or `CAP_SYS_NICE`): a PyTorch trainer spins its OpenMP
/// threads on every core, and at equal priority libtorch_cpu.so's table (about 0.2 s of CPU)
/// took 1.5-2.2 s to build on a loaded 2-core machine, while 13-24% of the main thread's
/// stacks of an 8 s `--pid` run were walked without it; 10 less nice, 0.3-0.8 s and 7-9%.
/// The build costs the target the same CPU either way, only sooner.
const FOREGROUND_BOOST: i32 = 10;

/// Whether table builds yield the CPU to the rest of the process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BuildPriority {
    /// [`FOREGROUND_BOOST`] less nice than the process where allowed, else at its own
    /// priority: a command-line run, whose user waits for whole stacks (niced on a loaded
    /// machine, libtorch_cpu.so's table took 3.8 s instead of 0.5 s, most of a 10 s run).
    #[default]
    Foreground,
    /// [`BUILD_NICENESS`] nicer: in an agent, which runs beside the host's work for good, and
    /// whose threads that tick windows must not wait behind builds for a CPU.
    Background,
    /// [`BUILD_NICENESS`] nicer, as [`Self::Background`], except the build of an object a run
    /// was seen sampling, which runs [`FOREGROUND_BOOST`] less nice on one thread at a time:
    /// a daemon's. Its clients must not wait behind builds for a CPU (a `list` waited 184 ms
    /// behind two builds at equal priority on a busy 2-core machine), and one boosted build
    /// leaves them the other cores; but a caller profiling one call of a PyTorch trainer waits
    /// for whole stacks of the code it runs, and with every build niced, 34-48% of each
    /// strobelight call's stacks ended early (libtorch_cpu.so's table, 0.2 s of CPU, took
    /// seconds to build beside the trainer's spinning OpenMP threads).
    SampledFirst,
}

/// Where a job's ELF image is: an open file (opened when the job was made, so the target may
/// exit meanwhile) or bytes already read (the vDSO, which has no file).
pub(crate) enum Image {
    /// An object file the target maps.
    File(std::fs::File),
    /// An image read from the target's memory.
    Memory(Vec<u8>),
}

/// One table to build.
pub(crate) struct Job {
    /// The object's identity.
    pub key: FileKey,
    /// Its image.
    pub image: Image,
    /// Its size in bytes: eager jobs run smallest first, so that many objects get tables
    /// before a few huge ones.
    pub size: u64,
}

/// A finished build.
pub(crate) struct Built {
    /// The object's identity.
    pub key: FileKey,
    /// Its table, or why it has none.
    pub table: anyhow::Result<UnwindTable>,
    /// How long the build took.
    pub took: Duration,
    /// The CPU it cost (less than `took` where the build waited for a CPU or for the disk).
    pub cpu: Duration,
    /// Whether it ran boosted (see [`BuildPriority::SampledFirst`]).
    pub boosted: bool,
    /// Whether the table was read from the on-disk cache instead of built.
    pub cached: bool,
}

/// One owner's jobs not started yet, by key (the jobs themselves are in [`Queue::jobs`]: two
/// owners whose processes map one file wait for one build, in both their queues).
#[derive(Default)]
struct OwnerQueue {
    /// Objects its processes were seen running, the most recently sampled first.
    urgent: VecDeque<FileKey>,
    /// The rest, by size (smallest first).
    rest: Vec<(u64, FileKey)>,
    /// Whether one of its builds is in progress.
    running: bool,
    /// The CPU its builds have cost while it had builds to wait for.
    cpu: Duration,
}

impl OwnerQueue {
    fn is_idle(&self) -> bool {
        !self.running && self.urgent.is_empty() && self.rest.is_empty()
    }

    fn remove(&mut self, key: &FileKey) {
        self.urgent.retain(|k| k != key);
        self.rest.retain(|(_, k)| k != key);
    }

    /// Its next job and whether it is urgent: urgent ones first, then the smallest.
    fn pop(&mut self) -> Option<(FileKey, bool)> {
        self.urgent
            .pop_front()
            .map(|k| (k, true))
            .or_else(|| (!self.rest.is_empty()).then(|| (self.rest.remove(0).1, false)))
    }
}

/// The jobs not started yet, per owner.
#[derive(Default)]
struct Queue {
    jobs: HashMap<FileKey, Job>,
    owners: BTreeMap<Owner, OwnerQueue>,
    /// The owner served last: among owners that used as much CPU, the next one after it goes.
    last_served: Option<Owner>,
    /// Whether a build runs boosted (see [`BuildPriority::SampledFirst`]).
    boosted: bool,
    closed: bool,
}

impl Queue {
    /// The queue of `owner`, made when it had none: a new owner starts with the CPU of the
    /// least served owner waiting, so it goes before any owner that used more, and cannot
    /// claim the time it was away to starve the others later.
    fn owner(&mut self, owner: Owner) -> &mut OwnerQueue {
        if !self.owners.contains_key(&owner) {
            let cpu = self
                .owners
                .values()
                .map(|q| q.cpu)
                .min()
                .unwrap_or_default();
            self.owners.insert(
                owner,
                OwnerQueue {
                    cpu,
                    ..OwnerQueue::default()
                },
            );
        }
        self.owners.get_mut(&owner).expect("just made")
    }

    /// Queues `job` for `owner` (see [`Builder::submit`]).
    fn submit(&mut self, job: Job, owner: Owner, urgent: bool) {
        let key = job.key.clone();
        self.jobs.entry(key.clone()).or_insert(job);
        if urgent {
            self.promote(&key, owner);
        } else {
            self.want(&key, owner);
        }
    }

    /// Adds the queued job of `key` to `owner`'s queue, by its size; false when it is not
    /// queued (running or done).
    fn want(&mut self, key: &FileKey, owner: Owner) -> bool {
        let Some(size) = self.jobs.get(key).map(|j| j.size) else {
            return false;
        };
        let queue = self.owner(owner);
        if !queue.urgent.contains(key) && !queue.rest.iter().any(|(_, k)| k == key) {
            let at = queue.rest.partition_point(|(s, _)| *s <= size);
            queue.rest.insert(at, (size, key.clone()));
        }
        true
    }

    /// Puts the queued job of `key` at the front of `owner`'s queue; false when it is not
    /// queued (running or done).
    fn promote(&mut self, key: &FileKey, owner: Owner) -> bool {
        if !self.jobs.contains_key(key) {
            return false;
        }
        let queue = self.owner(owner);
        if queue.urgent.front() != Some(key) {
            queue.remove(key);
            queue.urgent.push_front(key.clone());
        }
        true
    }

    /// The next job to build, whom it is charged to and whether it runs boosted (an urgent
    /// job at [`BuildPriority::SampledFirst`] while no other build is boosted): the next job
    /// of the owner, among those with no build in progress, whose builds cost the least CPU
    /// (ties in turn after the owner served last). It leaves every owner's queue.
    fn take(&mut self, priority: BuildPriority) -> Option<(Owner, Job, bool)> {
        let after = self.last_served;
        let owner = self
            .owners
            .iter()
            .filter(|(_, q)| !q.running && (!q.urgent.is_empty() || !q.rest.is_empty()))
            // Least CPU first; among equals, the owners after the last served, in order.
            .min_by_key(|(o, q)| (q.cpu, after.is_some_and(|a| **o <= a), **o))
            .map(|(o, _)| *o)?;
        let (key, urgent) = self.owners.get_mut(&owner)?.pop()?;
        for queue in self.owners.values_mut() {
            queue.remove(&key);
        }
        let job = self.jobs.remove(&key)?;
        if let Some(queue) = self.owners.get_mut(&owner) {
            queue.running = true;
        }
        self.last_served = Some(owner);
        self.owners.retain(|_, q| !q.is_idle());
        let boost = priority == BuildPriority::SampledFirst && urgent && !self.boosted;
        self.boosted |= boost;
        Some((owner, job, boost))
    }

    /// Notes that a build of `owner`'s ended after costing `cpu`, and whether it ran boosted.
    fn done(&mut self, owner: Owner, cpu: Duration, boosted: bool) {
        self.boosted &= !boosted;
        if let Some(queue) = self.owners.get_mut(&owner) {
            queue.running = false;
            queue.cpu += cpu;
        }
        // An owner with nothing left to wait for is forgotten with its CPU (see `owner`).
        self.owners.retain(|_, q| !q.is_idle());
    }
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The build threads and their queues; dropping it ends the threads after their current builds.
pub(crate) struct Builder {
    shared: Arc<Shared>,
    finished: Receiver<Built>,
}

impl Builder {
    /// Starts the build threads, which read and file tables in `cache` where given.
    pub fn spawn(
        priority: BuildPriority,
        cache: Option<Arc<TableCache>>,
    ) -> std::io::Result<Builder> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        });
        let (tx, finished) = mpsc::channel();
        for i in 0..BUILD_THREADS {
            let (worker, tx, cache) = (shared.clone(), tx.clone(), cache.clone());
            std::thread::Builder::new()
                .name(format!("unwind-tables-{i}"))
                .spawn(move || build_loop(&worker, &tx, priority, cache))?;
        }
        Ok(Builder { shared, finished })
    }

    /// Queues `job` for `owner`: at the front of its queue when `urgent` (an object its
    /// process was seen running), else among its others by size. A job already queued for
    /// another owner is not built twice: it joins this owner's queue too, and goes with
    /// whichever owner's turn comes first.
    pub fn submit(&self, job: Job, owner: Owner, urgent: bool) {
        self.shared.lock().submit(job, owner, urgent);
        self.shared.wake.notify_one();
    }

    /// Adds the queued job of `key` to `owner`'s queue too (its processes map the object as
    /// well); false when it is not queued (running or done).
    pub fn want(&self, key: &FileKey, owner: Owner) -> bool {
        let wanted = self.shared.lock().want(key, owner);
        self.shared.wake.notify_one();
        wanted
    }

    /// Moves the queued job of `key` to the front of `owner`'s queue; false when it is not
    /// queued (running or done).
    pub fn promote(&self, key: &FileKey, owner: Owner) -> bool {
        let promoted = self.shared.lock().promote(key, owner);
        self.shared.wake.notify_one();
        promoted
    }

    /// The builds finished since the last call, without waiting.
    pub fn finished(&self) -> Vec<Built> {
        self.finished.try_iter().collect()
    }

    /// Waits until `deadline` for one more finished build.
    pub fn wait_finished(&self, deadline: Instant) -> Option<Built> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.finished.recv_timeout(left).ok()
    }
}

impl Drop for Builder {
    fn drop(&mut self) {
        let mut queue = self.shared.lock();
        queue.closed = true;
        queue.jobs.clear();
        queue.owners.clear();
        drop(queue);
        self.shared.wake.notify_all();
    }
}

fn build_loop(
    shared: &Shared,
    finished: &Sender<Built>,
    priority: BuildPriority,
    cache: Option<Arc<TableCache>>,
) {
    // Linux keeps a nice value per thread, and "the calling process" is this thread.
    let nice = rustix::process::getpriority_process(None).ok();
    let (base, boosted) = match nice {
        Some(nice) => (
            Some(match priority {
                BuildPriority::Foreground => (nice - FOREGROUND_BOOST).max(-20),
                BuildPriority::Background | BuildPriority::SampledFirst => nice + BUILD_NICENESS,
            }),
            Some((nice - FOREGROUND_BOOST).max(-20)),
        ),
        None => (None, None),
    };
    if let Some(nice) = base {
        // Unprivileged, a command-line run cannot lower its nice value: it builds at its own.
        if let Err(e) = rustix::process::setpriority_process(None, nice) {
            log::debug!("unwind table builds keep the process's priority: {e}");
        }
    }
    loop {
        let (owner, job, boost) = {
            let mut queue = shared.lock();
            loop {
                if queue.closed {
                    return;
                }
                if let Some(next) = queue.take(priority) {
                    break next;
                }
                queue = shared.wake.wait(queue).unwrap_or_else(|p| p.into_inner());
            }
        };
        // A boost that the system refuses (no CAP_SYS_NICE) leaves the build niced.
        let boosted =
            boost && boosted.is_some_and(|n| rustix::process::setpriority_process(None, n).is_ok());
        let (started, cpu_before) = (Instant::now(), crate::clock::thread_cpu_time());
        let result = build(&job.image, cache.as_deref());
        let cached = matches!(result, Ok(Cached::Read(_)));
        let (table, to_file) = match result {
            Ok(Cached::Read(table)) | Ok(Cached::Off(table)) => (Ok(table), None),
            Ok(Cached::Missed(table, key)) => {
                let entry = TableCache::entry(&key, &table);
                (Ok(table), Some((key, entry)))
            }
            Err(e) => (Err(e), None),
        };
        let cpu = crate::clock::thread_cpu_time().saturating_sub(cpu_before);
        if boosted {
            if let Some(nice) = base {
                let _ = rustix::process::setpriority_process(None, nice);
            }
        }
        shared.lock().done(owner, cpu, boost);
        // The owner may have more jobs, which only it held back: another thread may take one.
        shared.wake.notify_one();
        let built = Built {
            key: job.key,
            table,
            took: started.elapsed(),
            cpu,
            boosted,
            cached,
        };
        if finished.send(built).is_err() {
            return;
        }
        // Filed after the table went to the loader, and no longer boosted: writing it to disk
        // delays neither the table nor the threads that answer clients.
        if let (Some(cache), Some((key, entry))) = (&cache, to_file) {
            cache.store(&key, &entry);
        }
    }
}

/// A table and what the cache made of it.
enum Cached {
    /// Read from the cache.
    Read(UnwindTable),
    /// Built; it is to be filed under the key.
    Missed(UnwindTable, [u8; 32]),
    /// Built, with no cache in use.
    Off(UnwindTable),
}

/// The table of one image, from `cache` where it holds it (else built, and the key to file it
/// under). A hostile or broken file (truncated, not ELF, no CFI) is an error for this object
/// only.
fn build(image: &Image, cache: Option<&TableCache>) -> anyhow::Result<Cached> {
    match image {
        Image::File(file) => {
            // Read by pread, not mapped: the target's user may truncate the file meanwhile.
            let reader = crate::process::target_file::ElfReader::new(file.try_clone()?);
            build_elf(&reader, cache).map_err(|e| reader.explain(e))
        }
        Image::Memory(bytes) => build_elf(bytes.as_slice(), cache),
    }
}

fn build_elf<'data>(
    data: impl object::ReadRef<'data>,
    cache: Option<&TableCache>,
) -> anyhow::Result<Cached> {
    use anyhow::Context;
    let elf = object::File::parse(data).context("parsing the ELF headers")?;
    let inputs = CfiInputs::read(&elf)?;
    let Some(cache) = cache else {
        return Ok(Cached::Off(inputs.build()?.0));
    };
    let key = cache.key(&inputs);
    if let Some(table) = cache.get(&key) {
        return Ok(Cached::Read(table));
    }
    Ok(Cached::Missed(inputs.build()?.0, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, size: u64) -> Job {
        Job {
            key: FileKey::File {
                dev: 0,
                ino: size,
                size,
                mtime: 0,
                ctime: 0,
                uid: 0,
            },
            image: Image::Memory(name.as_bytes().to_vec()),
            size,
        }
    }

    /// Takes every job in turn, each finished at once at a cost of `cpu(size)`: the sizes
    /// in the order built, with their owners.
    fn drain(queue: &mut Queue, cpu: impl Fn(u64) -> Duration) -> Vec<(Owner, u64)> {
        let mut order = Vec::new();
        while let Some((owner, job, _)) = queue.take(BuildPriority::Background) {
            queue.done(owner, cpu(job.size), false);
            order.push((owner, job.size));
        }
        order
    }

    #[test]
    fn urgent_jobs_go_first_and_the_rest_by_size() {
        let mut queue = Queue::default();
        queue.submit(job("big", 300), 0, false);
        queue.submit(job("small", 100), 0, false);
        queue.submit(job("mid", 200), 0, false);
        queue.submit(job("hot", 400), 0, true);
        assert!(queue.promote(&job("", 200).key, 0));
        assert!(!queue.promote(&job("", 999).key, 0));
        let order: Vec<u64> = drain(&mut queue, |_| Duration::ZERO)
            .into_iter()
            .map(|(_, size)| size)
            .collect();
        assert_eq!(order, [200, 400, 100, 300]);
    }

    #[test]
    fn an_owner_with_many_costly_jobs_delays_another_by_one_build_at_most() {
        let mut queue = Queue::default();
        // Owner 1000 queued twenty objects, each smaller than owner 2000's one, and sampled
        // in all of them; each build costs a second per 100 bytes.
        for size in 1..=20 {
            queue.submit(job("a", size), 1000, true);
        }
        let (owner, first, _) = queue.take(BuildPriority::Background).unwrap();
        assert_eq!(owner, 1000);
        queue.submit(job("b", 500), 2000, false);
        queue.submit(job("b2", 600), 2000, false);
        // While owner 1000's build runs, the other thread takes owner 2000's job, never a
        // second one of owner 1000's.
        let (owner, second, _) = queue.take(BuildPriority::Background).unwrap();
        assert_eq!((owner, second.size), (2000, 500));
        assert!(
            queue.take(BuildPriority::Background).is_none(),
            "each owner runs one build at a time"
        );
        queue.done(1000, Duration::from_secs(first.size), false);
        queue.done(2000, Duration::from_secs(5), false);
        let order = drain(&mut queue, |size| Duration::from_secs(size / 100));
        // Owner 2000 used 5 s, owner 1000 20 s: 2000 goes on until it used as much.
        assert_eq!(order[0], (2000, 600));
        assert!(order[1..].iter().all(|(o, _)| *o == 1000), "{order:?}");
        assert_eq!(order.len(), 20);
    }

    #[test]
    fn owners_that_used_as_much_take_turns_and_a_shared_job_is_built_once() {
        let mut queue = Queue::default();
        for size in [10, 20, 30] {
            queue.submit(job("a", size), 1000, false);
            queue.submit(job("b", size + 1), 2000, false);
        }
        // One file both owners' processes map: built once, for whichever turn comes first.
        queue.submit(job("libc", 25), 1000, false);
        queue.submit(job("libc", 25), 2000, false);
        let order = drain(&mut queue, |_| Duration::from_millis(1));
        assert_eq!(
            order,
            [
                (1000, 10),
                (2000, 11),
                (1000, 20),
                (2000, 21),
                (1000, 25),
                (2000, 31),
                (1000, 30)
            ]
        );
    }

    #[test]
    fn a_new_owner_starts_level_with_the_least_served() {
        let mut queue = Queue::default();
        queue.submit(job("a", 1), 1000, false);
        let (owner, _, _) = queue.take(BuildPriority::Background).unwrap();
        queue.submit(job("a", 2), 1000, false);
        queue.done(owner, Duration::from_secs(100), false);
        // Owner 1000 used 100 s alone; owner 2000 arrives and does not get 100 s of turns.
        for size in [3, 4] {
            queue.submit(job("b", size), 2000, false);
        }
        let order = drain(&mut queue, |_| Duration::from_secs(1));
        assert_eq!(order, [(2000, 3), (1000, 2), (2000, 4)]);
    }

    #[test]
    fn one_sampled_object_at_a_time_is_built_boosted_in_a_daemon() {
        let mut queue = Queue::default();
        queue.submit(job("small", 10), 1000, false);
        queue.submit(job("libtorch", 400), 1000, true);
        queue.submit(job("libc", 20), 2000, true);
        let take = |queue: &mut Queue| {
            let (owner, job, boost) = queue.take(BuildPriority::SampledFirst).unwrap();
            (owner, job.size, boost)
        };
        // Owner 1000's sampled object goes boosted; owner 2000's, sampled too, meanwhile not.
        assert_eq!(take(&mut queue), (1000, 400, true));
        assert_eq!(take(&mut queue), (2000, 20, false));
        queue.done(2000, Duration::ZERO, false);
        queue.done(1000, Duration::ZERO, true);
        // Not sampled: niced.
        assert_eq!(take(&mut queue), (1000, 10, false));
        queue.done(1000, Duration::ZERO, false);
        queue.submit(job("libgomp", 30), 2000, true);
        assert_eq!(take(&mut queue), (2000, 30, true));
        // An agent's builds are never boosted.
        queue.done(2000, Duration::ZERO, true);
        queue.submit(job("libm", 40), 2000, true);
        let (_, _, boost) = queue.take(BuildPriority::Background).unwrap();
        assert!(!boost);
    }

    #[test]
    fn a_broken_image_is_an_error_not_a_panic() {
        let builder = Builder::spawn(BuildPriority::Background, None).unwrap();
        builder.submit(job("not an ELF file", 10), 0, false);
        let built = builder
            .wait_finished(Instant::now() + Duration::from_secs(10))
            .expect("the build finishes");
        assert!(built.table.is_err());
    }

    #[test]
    fn a_table_filed_in_the_cache_is_read_back_by_another_build_and_a_changed_object_misses() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(TableCache::open(&dir.path().join("unwind"), 1 << 30).unwrap());
        let libc = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        let files = std::cell::Cell::new(0);
        let build = |image: Vec<u8>| {
            // A builder of its own each time: a new bpfprof process, as far as the cache goes.
            let builder = Builder::spawn(BuildPriority::Background, Some(cache.clone())).unwrap();
            let mut job = job("", image.len() as u64);
            job.image = Image::Memory(image);
            builder.submit(job, 0, false);
            let built = builder
                .wait_finished(Instant::now() + Duration::from_secs(60))
                .expect("the build finishes");
            // A built table is filed after it is handed on: wait for the entry.
            let deadline = Instant::now() + Duration::from_secs(60);
            while built.table.is_ok()
                && !built.cached
                && super::super::cache::usage(cache.dir()).unwrap().0 < files.get() + 1
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            files.set(super::super::cache::usage(cache.dir()).unwrap().0);
            (built.table, built.cached)
        };
        let (first, cached) = build(libc.clone());
        let first = first.unwrap();
        assert!(!cached, "an empty cache builds");
        assert!(first.rows.len() > 1000);
        let (second, cached) = build(libc.clone());
        let second = second.unwrap();
        assert!(cached, "the second build reads the first one's table");
        assert_eq!(first, second);
        assert_eq!(super::super::cache::usage(cache.dir()).unwrap().0, 1);

        // One byte of .eh_frame changed (the object rebuilt at the same path): a new key, so
        // a build, never the old table.
        let elf = object::File::parse(libc.as_slice()).unwrap();
        use object::{Object, ObjectSection};
        let (offset, _) = elf
            .section_by_name(".eh_frame")
            .unwrap()
            .file_range()
            .unwrap();
        let mut changed = libc.clone();
        let at = offset as usize + 0x10;
        changed[at] = changed[at].wrapping_add(1);
        // Whatever the change makes of the CFI (a broken entry here), it is not the old table.
        let (changed, cached) = build(changed);
        assert!(!cached, "a changed .eh_frame misses the cache");
        assert!(changed.map_or(true, |t| t != first));
    }
}
