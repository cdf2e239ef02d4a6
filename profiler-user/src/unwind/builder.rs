//! Builds unwind tables on a thread of their own, so that no caller waits for one: a 430 MB
//! library (PyTorch's `libtorch_cpu.so`, 2.6 million rows) takes about half a second, and a
//! process like PyTorch maps seventy objects. The caller submits jobs, asks for the sampled
//! ones first, and installs finished tables when it next looks (see [`super::UnwindMaps`]).

use std::{
    collections::VecDeque,
    sync::{
        mpsc::{self, Receiver, Sender},
        Arc, Condvar, Mutex,
    },
    time::{Duration, Instant},
};

use super::{loader::FileKey, table::UnwindTable};

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
}

/// The jobs not started yet: urgent ones (sampled objects) first, then the rest by size.
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Jobs at the front that were asked for urgently.
    urgent: usize,
    closed: bool,
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

/// The build thread and its queues; dropping it ends the thread after its current build.
pub(crate) struct Builder {
    shared: Arc<Shared>,
    finished: Receiver<Built>,
}

impl Builder {
    /// Starts the build thread.
    pub fn spawn() -> std::io::Result<Builder> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        });
        let (tx, finished) = mpsc::channel();
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("unwind-tables".into())
            .spawn(move || build_loop(&worker, &tx))?;
        Ok(Builder { shared, finished })
    }

    /// Queues `job`: at the front when `urgent` (an object the target was seen running),
    /// else among the others by size.
    pub fn submit(&self, job: Job, urgent: bool) {
        let mut queue = self.shared.lock();
        if urgent {
            queue.jobs.push_front(job);
            queue.urgent += 1;
        } else {
            let skip = queue.urgent;
            let at = skip
                + queue
                    .jobs
                    .iter()
                    .skip(skip)
                    .take_while(|j| j.size <= job.size)
                    .count();
            queue.jobs.insert(at, job);
        }
        drop(queue);
        self.shared.wake.notify_one();
    }

    /// Moves the queued job of `key` to the front; false when it is not queued (running or done).
    pub fn promote(&self, key: &FileKey) -> bool {
        let mut queue = self.shared.lock();
        let Some(at) = queue.jobs.iter().position(|j| j.key == *key) else {
            return false;
        };
        if at >= queue.urgent {
            let job = queue.jobs.remove(at).expect("the position was just found");
            queue.jobs.push_front(job);
            queue.urgent += 1;
        }
        true
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
        drop(queue);
        self.shared.wake.notify_all();
    }
}

fn build_loop(shared: &Shared, finished: &Sender<Built>) {
    loop {
        let job = {
            let mut queue = shared.lock();
            loop {
                if queue.closed {
                    return;
                }
                if let Some(job) = queue.jobs.pop_front() {
                    queue.urgent = queue.urgent.saturating_sub(1);
                    break job;
                }
                queue = shared.wake.wait(queue).unwrap_or_else(|p| p.into_inner());
            }
        };
        let started = Instant::now();
        let table = build(&job.image);
        let built = Built {
            key: job.key,
            table,
            took: started.elapsed(),
        };
        if finished.send(built).is_err() {
            return;
        }
    }
}

/// The table of one image. A hostile or broken file (truncated, not ELF, no CFI) is an
/// error for this object only.
fn build(image: &Image) -> anyhow::Result<UnwindTable> {
    let (table, _source) = match image {
        Image::File(file) => {
            // Read by pread, not mapped: the target's user may truncate the file meanwhile.
            let reader = crate::process::target_file::ElfReader::new(file.try_clone()?);
            UnwindTable::from_elf(&reader).map_err(|e| reader.explain(e))?
        }
        Image::Memory(bytes) => UnwindTable::from_elf(bytes.as_slice())?,
    };
    Ok(table)
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

    #[test]
    fn urgent_jobs_go_first_and_the_rest_by_size() {
        let builder = Builder {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                wake: Condvar::new(),
            }),
            finished: mpsc::channel().1,
        };
        builder.submit(job("big", 300), false);
        builder.submit(job("small", 100), false);
        builder.submit(job("mid", 200), false);
        builder.submit(job("hot", 400), true);
        assert!(builder.promote(&job("", 200).key));
        assert!(!builder.promote(&job("", 999).key));
        let order: Vec<u64> = builder.shared.lock().jobs.iter().map(|j| j.size).collect();
        assert_eq!(order, [200, 400, 100, 300]);
        assert_eq!(builder.shared.lock().urgent, 2);
    }

    #[test]
    fn a_broken_image_is_an_error_not_a_panic() {
        let builder = Builder::spawn().unwrap();
        builder.submit(job("not an ELF file", 10), false);
        let built = builder
            .wait_finished(Instant::now() + Duration::from_secs(10))
            .expect("the build finishes");
        assert!(built.table.is_err());
    }
}
