//! Calls into Python: forwarding an RPC to the asyncio loop, the debug line per RPC, the
//! per-connection checks (allowedClients, TLS file reload). Python decides; every call here
//! takes the GIL only for as long as it takes to hand the work over.

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::oneshot;

use crate::answer::{frame, status, Answer, INTERNAL, UNAVAILABLE};

/// The Python side's callables (see transport/server.py).
pub struct Hooks {
    pub event_loop: PyObject,
    /// dispatch(method index, request bytes, timeout seconds or None, request id, reply)
    pub dispatch: PyObject,
    /// cancel(request id): the caller is gone (deadline, cancelled, server cut off)
    pub cancel: PyObject,
    /// log_rpc(request id, method index, status code, seconds)
    pub log_rpc: PyObject,
    /// admit(common names, DNS SANs) -> None or the denial; None when all may call.
    pub admit: Option<PyObject>,
    /// tls_check(): reloads changed TLS files (and calls set_tls); None without TLS.
    pub tls_check: Option<PyObject>,
    /// tls_refused(peer address, reason): a TLS handshake that failed (Python rate-limits
    /// the log lines); None without TLS.
    pub tls_refused: Option<PyObject>,
}

pub struct Bridge {
    /// None once the server has stopped (`release`). These are bound methods of the objects
    /// that hold the server, and Python's garbage collector sees no reference a compiled
    /// object keeps: held for good, they kept each stopped server and the whole provider
    /// behind it alive (every start and stop in one process added one).
    hooks: ArcSwapOption<Hooks>,
    /// How often tls_check is worth calling (Python's reload interval).
    tls_pace: Pace,
    /// Forwarded calls given up on (deadline, cancelled) that Python is still running.
    abandoned: Arc<AtomicUsize>,
}

/// At most one "due" per interval, the first one interval after the start (Python has just
/// loaded the files then): a connection accepted in between takes no GIL for the check.
pub struct Pace {
    base: Instant,
    every: Duration,
    /// Nanoseconds after `base` from when the next call is due.
    next: AtomicU64,
}

impl Pace {
    pub fn new(every: Duration) -> Pace {
        let next = u64::try_from(every.as_nanos()).unwrap_or(u64::MAX);
        Pace {
            base: Instant::now(),
            every,
            next: AtomicU64::new(next),
        }
    }

    fn due(&self) -> bool {
        let now = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let next = self.next.load(SeqCst);
        let after = now.saturating_add(u64::try_from(self.every.as_nanos()).unwrap_or(u64::MAX));
        now >= next
            && self
                .next
                .compare_exchange(next, after, SeqCst, SeqCst)
                .is_ok()
    }
}

const RUNNING: u8 = 0;
const FINISHED: u8 = 1;
const ABANDONED: u8 = 2;

/// How one forwarded call ended, seen from both sides: Python finishing it (it publishes the
/// hot answers before it replies), the caller giving up on it first.
struct Outcome {
    state: AtomicU8,
    abandoned: Arc<AtomicUsize>,
}

impl Outcome {
    fn abandon(&self) {
        // Counted before the caller can get its answer; undone if Python had finished.
        self.abandoned.fetch_add(1, SeqCst);
        if self
            .state
            .compare_exchange(RUNNING, ABANDONED, SeqCst, SeqCst)
            .is_err()
        {
            self.abandoned.fetch_sub(1, SeqCst);
        }
    }

    fn finish(&self) {
        if self.state.swap(FINISHED, SeqCst) == ABANDONED {
            self.abandoned.fetch_sub(1, SeqCst);
        }
    }
}

/// Handed to Python with a forwarded call; Python calls exactly one of its methods, and a
/// Reply dropped without one ends the call too.
#[pyclass(frozen)]
pub struct Reply {
    sender: Mutex<Option<oneshot::Sender<Answer>>>,
    outcome: Arc<Outcome>,
}

impl Reply {
    fn send(&self, answer: Answer) {
        let sender = self.sender.lock().map(|mut s| s.take()).unwrap_or(None);
        if let Some(sender) = sender {
            let _ = sender.send(answer); // the caller may be gone (deadline, cancel)
        }
        self.outcome.finish();
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        self.outcome.finish();
    }
}

#[pymethods]
impl Reply {
    fn ok(&self, message: &[u8]) {
        self.send(Answer::Ok(frame(message)));
    }

    fn error(&self, code: u8, message: &str) {
        self.send(status(code, message));
    }
}

impl Bridge {
    pub fn new(hooks: Hooks, tls_pace: Pace) -> Bridge {
        Bridge {
            hooks: ArcSwapOption::from_pointee(hooks),
            tls_pace,
            abandoned: Default::default(),
        }
    }

    /// Drops the references to Python's callables, at once (the GIL is held). Only once the
    /// server has stopped and its tasks are gone: what would call Python from then on is told
    /// the server is shutting down.
    pub fn release(&self, _py: Python<'_>) {
        self.hooks.store(None);
    }

    /// Hands the call to Python's loop and waits for its answer.
    pub async fn forward(
        &self,
        method: usize,
        message: bytes::Bytes,
        timeout: Option<Duration>,
        id: &str,
        may_change_state: bool,
    ) -> Answer {
        let (sender, receiver) = oneshot::channel();
        let outcome = Arc::new(Outcome {
            state: AtomicU8::new(RUNNING),
            abandoned: self.abandoned.clone(),
        });
        let handed = Python::with_gil(|py| -> PyResult<bool> {
            let Some(hooks) = self.hooks.load_full() else {
                return Ok(false);
            };
            let reply = Reply {
                sender: Mutex::new(Some(sender)),
                outcome: outcome.clone(),
            };
            let reply = Py::new(py, reply)?;
            let args = (
                hooks.dispatch.clone_ref(py),
                method,
                PyBytes::new(py, &message),
                timeout.map(|t| t.as_secs_f64()),
                id,
                reply,
            );
            hooks
                .event_loop
                .call_method1(py, "call_soon_threadsafe", args)
                .map(|_| true)
        });
        drop(message); // Python has its copy: a large request is not held twice
        if !matches!(handed, Ok(true)) {
            return status(UNAVAILABLE, "the server is shutting down");
        }
        let mut pending = Pending {
            bridge: self,
            id,
            outcome: may_change_state.then_some(outcome),
        };
        let answer = receiver
            .await
            .unwrap_or_else(|_| status(INTERNAL, "the call was dropped without an answer"));
        pending.id = "";
        answer
    }

    /// No forwarded call is left running in Python after its caller gave up on it. While one
    /// is, the hot answers may predate what it changed (Python publishes only when it ends).
    pub fn settled(&self) -> bool {
        self.abandoned.load(SeqCst) == 0
    }

    pub fn log_rpc(&self, id: &str, method: usize, code: u8, took: Duration) {
        Python::with_gil(|py| {
            let Some(hooks) = self.hooks.load_full() else {
                return;
            };
            let args = (id, method, code, took.as_secs_f64());
            if let Err(error) = hooks.log_rpc.call1(py, args) {
                error.write_unraisable(py, None);
            }
        });
    }

    /// None when the client named so may call CloudProvider, else the denial.
    pub fn admit(&self, names: (Vec<String>, Vec<String>)) -> Option<String> {
        let hooks = self.hooks.load_full();
        let Some(hooks) = hooks else {
            return Some("the server is shutting down".to_string());
        };
        let admit = hooks.admit.as_ref()?;
        Python::with_gil(|py| match admit.call1(py, names) {
            Ok(decision) => decision.extract::<Option<String>>(py).unwrap_or(None),
            Err(error) => {
                error.write_unraisable(py, None);
                Some("the allowedClients check failed; see the server log".to_string())
            }
        })
    }

    pub fn tls_refused(&self, peer: std::net::SocketAddr, reason: String) {
        let hooks = self.hooks.load_full();
        if let Some(refused) = hooks.as_ref().and_then(|h| h.tls_refused.as_ref()) {
            Python::with_gil(|py| {
                if let Err(error) = refused.call1(py, (peer.to_string(), reason)) {
                    error.write_unraisable(py, None);
                }
            });
        }
    }

    pub fn tls_check(&self) {
        let hooks = self.hooks.load_full();
        let check = hooks.as_ref().and_then(|h| h.tls_check.as_ref());
        if let Some(check) = check.filter(|_| self.tls_pace.due()) {
            Python::with_gil(|py| {
                if let Err(error) = check.call0(py) {
                    error.write_unraisable(py, None);
                }
            });
        }
    }
}

/// A forwarded call whose caller may give up: dropped before Python answered, it tells Python
/// to cancel the call's task, as a gRPC server cancels the handler of a call that is gone. One
/// that may change state counts as abandoned until Python has ended it.
struct Pending<'a> {
    bridge: &'a Bridge,
    id: &'a str,
    outcome: Option<Arc<Outcome>>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.id.is_empty() {
            return;
        }
        if let Some(outcome) = &self.outcome {
            outcome.abandon();
        }
        Python::with_gil(|py| {
            let Some(hooks) = self.bridge.hooks.load_full() else {
                return; // released: the server has stopped, and Python cancelled the rest
            };
            let args = (hooks.cancel.clone_ref(py), self.id);
            // Fails only when the loop is closed: then nothing runs that could be cancelled.
            let _ = hooks
                .event_loop
                .call_method1(py, "call_soon_threadsafe", args);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pace_is_due_once_per_interval_from_the_start() {
        let always = Pace::new(Duration::ZERO);
        assert!(always.due() && always.due());
        let hourly = Pace::new(Duration::from_secs(3600));
        assert!(!hourly.due());
        hourly.next.store(0, SeqCst); // an hour later
        assert!(hourly.due());
        assert!(!hourly.due());
    }
}
