//! `dump`'s view of the event loops: every task, what it awaits, drawn as a tree.

use super::*;

/// One event loop's tasks, as `bpfprof dump` shows them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LoopTasks {
    /// The host tid of the thread that runs the loop.
    pub tid: u32,
    /// The loop's address (0: the thread runs none now; its tasks are listed still).
    pub running_loop: u64,
    /// The task the thread runs now (0: none).
    pub running_task: u64,
    /// Its tasks, in its list's order.
    pub tasks: Vec<DumpTask>,
    /// Whether the list was cut (longer than [`MAX_TASKS_LISTED`], or it looped).
    pub cut: bool,
    /// Whether the tasks were read while the process was stopped, with the stacks (false
    /// where a thread had more than [`MAX_TASKS_IN_STOP`]: read once it ran again).
    pub read_in_stop: bool,
}

/// One task in a dump.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DumpTask {
    /// Its address (`python -m asyncio ps`'s task id).
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its coroutine's function (qualified name), where it could be read.
    pub coroutine: Option<String>,
    /// The coroutines it is suspended in, innermost first as `python -m asyncio pstree`
    /// draws them (`sleep`, then the coroutine awaiting it, ..., its own coroutine last);
    /// empty for a running task (the thread's, or one found executing as it is read: its
    /// stack is the thread's) and where none could be read.
    pub coroutine_stack: Vec<String>,
    /// The tasks awaiting it (ids).
    pub awaited_by: Vec<u64>,
}

/// One event loop's tasks as read with the process stopped, before any is named.
#[derive(Clone, Debug)]
pub struct LoopRead {
    tid: u32,
    running_loop: u64,
    running_task: u64,
    /// Each task, with the code objects of the coroutines it is suspended in (its own first).
    tasks: Vec<(TaskInfo, Vec<u64>)>,
    cut: bool,
    read_in_stop: bool,
}

impl super::super::PythonTarget {
    /// The process's `_asyncio` layout, looked for with the process running: `Ok(None)`
    /// before 3.14 or while the process has not imported asyncio.
    pub fn asyncio_layout(&self) -> Result<Option<AsyncioLayout>> {
        let (_, minor) = self.version();
        if minor < FIRST_ASYNC_MINOR {
            return Ok(None);
        }
        find_layout(self.pid, &self.memory, self.interpreter.runtime, minor)
    }

    /// The tasks of each of `threads` (host tid, thread state) that has any, for `dump`.
    ///
    /// With `in_stop`, read while the process is stopped, with its threads' stacks: a running
    /// process switches tasks every few microseconds, and a tree read task by task would show
    /// tasks as they were at different moments, none of them the moment of the stacks. Then
    /// `Ok(None)` when a thread has more than [`MAX_TASKS_IN_STOP`]: they are read again
    /// without `in_stop` once the process runs.
    pub fn read_asyncio_tasks(
        &self,
        asyncio: &AsyncioLayout,
        threads: &[(u32, u64)],
        in_stop: bool,
    ) -> Result<Option<Vec<LoopRead>>> {
        let reader = TaskReader {
            memory: &self.memory,
            layout: &self.layout,
            asyncio,
        };
        // One past the stop's bound, to tell a list longer than it.
        let limit = if in_stop {
            MAX_TASKS_IN_STOP + 1
        } else {
            MAX_TASKS_LISTED
        };
        let mut loops = Vec::new();
        for &(tid, tstate) in threads {
            let (running_loop, addresses, cut) = reader.thread_tasks(tstate, limit)?;
            if in_stop && addresses.len() > MAX_TASKS_IN_STOP {
                return Ok(None);
            }
            let running_task = reader
                .memory
                .read_u64(tstate.wrapping_add(asyncio.tstate_running_task as u64))?;
            let tasks: Vec<(TaskInfo, Vec<u64>)> = addresses
                .iter()
                .filter_map(|&t| {
                    let info = reader.task(t).ok()?;
                    let stack = if t == running_task {
                        Vec::new()
                    } else {
                        reader.awaited_coroutines(t)
                    };
                    Some((info, stack))
                })
                .collect();
            if tasks.is_empty() && running_loop == 0 {
                continue;
            }
            loops.push(LoopRead {
                tid,
                running_loop,
                running_task,
                tasks,
                cut,
                read_in_stop: in_stop,
            });
        }
        Ok(Some(loops))
    }

    /// Names the coroutines of `loops` (with the process running again: code objects do not
    /// change).
    pub fn name_asyncio_tasks(&mut self, loops: Vec<LoopRead>) -> Vec<LoopTasks> {
        loops
            .into_iter()
            .map(|l| LoopTasks {
                tid: l.tid,
                running_loop: l.running_loop,
                running_task: l.running_task,
                tasks: l
                    .tasks
                    .into_iter()
                    .map(|(t, stack)| DumpTask {
                        id: t.address,
                        coroutine: (t.coro_code != 0)
                            .then(|| self.code_name(t.coro_code))
                            .flatten(),
                        coroutine_stack: stack
                            .iter()
                            .rev()
                            .map(|&code| self.code_name(code).unwrap_or_else(|| "?".into()))
                            .collect(),
                        name: t.name,
                        awaited_by: t.awaited_by,
                    })
                    .collect(),
                cut: l.cut,
                read_in_stop: l.read_in_stop,
            })
            .collect()
    }
}

/// Lines of a drawn task tree at most: each task is expanded once, so a tree has no more
/// lines than tasks and awaiter links, but a process may list 100 000 tasks each awaited by a
/// set of 1024.
const MAX_TREE_LINES: usize = 100_000;

/// The task tree of `tasks` as `python -m asyncio pstree` draws it: each task under each task
/// awaiting it, roots (awaited by none) first; a task met again on its own branch (a cycle)
/// is marked and not followed. What a task awaits is drawn once, under its first waiter: drawn
/// again under every waiter, tasks awaited by two tasks each (two tasks `gather`ing the same
/// two, layer on layer) made a tree of 2**layers lines, which took `dump` past 3.6 GB in 20
/// s on a hostile 40-layer process. Tasks no root reaches (those in a cycle of awaiters)
/// follow, each drawn from the first of them met. At most [`MAX_TREE_LINES`] lines, and a
/// last one saying how many tasks were left out.
pub fn render_tree(tasks: &[DumpTask]) -> Vec<String> {
    let by_id: HashMap<u64, &DumpTask> = tasks.iter().map(|t| (t.id, t)).collect();
    let mut children: HashMap<u64, Vec<u64>> = HashMap::new();
    for t in tasks {
        for parent in t.awaited_by.iter().filter(|p| by_id.contains_key(p)) {
            children.entry(*parent).or_default().push(t.id);
        }
    }
    struct Tree<'a> {
        by_id: HashMap<u64, &'a DumpTask>,
        children: HashMap<u64, Vec<u64>>,
        /// Tasks whose awaited tasks are drawn.
        expanded: HashSet<u64>,
        /// The branch being drawn, root first.
        path: Vec<u64>,
        lines: Vec<String>,
    }
    impl Tree<'_> {
        fn walk(&mut self, id: u64, prefix: &str, last: bool) {
            if self.lines.len() >= MAX_TREE_LINES {
                return;
            }
            let t = self.by_id[&id];
            let branch = if last { "└── " } else { "├── " };
            // The coroutines it is suspended in, as pstree draws them (`sleep -> work`), or
            // its own coroutine where no more could be read.
            let coroutine = if t.coroutine_stack.len() > 1 {
                t.coroutine_stack.join(" -> ")
            } else {
                t.coroutine.clone().unwrap_or_else(|| "?".into())
            };
            let looped = self.path.contains(&id);
            let kids = self.children.get(&id).cloned().unwrap_or_default();
            let again = !looped && !kids.is_empty() && self.expanded.contains(&id);
            let note = if looped {
                " [awaits itself: a cycle]"
            } else if again {
                " [what it awaits is shown above]"
            } else {
                ""
            };
            self.lines
                .push(format!("{prefix}{branch}(T) {} {coroutine}{note}", t.name));
            if looped || again {
                return;
            }
            self.expanded.insert(id);
            self.path.push(id);
            let next = format!("{prefix}{}", if last { "    " } else { "│   " });
            for (i, kid) in kids.iter().enumerate() {
                self.walk(*kid, &next, i + 1 == kids.len());
            }
            self.path.pop();
        }
    }
    let mut tree = Tree {
        by_id,
        children,
        expanded: HashSet::new(),
        path: Vec::new(),
        lines: Vec::new(),
    };
    let roots: Vec<u64> = tasks
        .iter()
        .filter(|t| !t.awaited_by.iter().any(|p| tree.by_id.contains_key(p)))
        .map(|t| t.id)
        .collect();
    for (i, root) in roots.iter().enumerate() {
        tree.walk(*root, "", i + 1 == roots.len());
    }
    // Tasks only a cycle awaits: no root reaches them.
    for t in tasks {
        if !tree.expanded.contains(&t.id) && tree.lines.len() < MAX_TREE_LINES {
            let at = tree.lines.len();
            tree.walk(t.id, "", true);
            if let Some(line) = tree.lines.get_mut(at) {
                line.push_str(" [awaited only within a cycle]");
            }
        }
    }
    if tree.lines.len() >= MAX_TREE_LINES {
        let left = tasks
            .iter()
            .filter(|t| !tree.expanded.contains(&t.id))
            .count();
        tree.lines.push(format!(
            "[tree cut at {MAX_TREE_LINES} lines: {left} tasks not drawn]"
        ));
    }
    tree.lines
}
