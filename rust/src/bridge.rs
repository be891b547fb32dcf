//! Calls into Python: forwarding an RPC to the asyncio loop, the debug line per RPC, the
//! per-connection checks (allowedClients, TLS file reload). Python decides; every call here
//! takes the GIL only for as long as it takes to hand the work over.

use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::oneshot;

use crate::grpc::{frame, status};
use crate::snapshot::Answer;

const UNAVAILABLE: u8 = 14;
const INTERNAL: u8 = 13;

/// The Python side's callables (see transport/server.py).
pub struct Bridge {
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

/// Handed to Python with a forwarded call; Python calls exactly one of its methods.
#[pyclass(frozen)]
pub struct Reply(Mutex<Option<oneshot::Sender<Answer>>>);

impl Reply {
    fn send(&self, answer: Answer) {
        let sender = self.0.lock().map(|mut s| s.take()).unwrap_or(None);
        if let Some(sender) = sender {
            let _ = sender.send(answer); // the caller may be gone (deadline, cancel)
        }
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
    pub async fn forward(
        &self,
        method: usize,
        message: &[u8],
        timeout: Option<Duration>,
        id: &str,
    ) -> Answer {
        let (sender, receiver) = oneshot::channel();
        let handed = Python::with_gil(|py| -> PyResult<()> {
            let reply = Py::new(py, Reply(Mutex::new(Some(sender))))?;
            let args = (
                self.dispatch.clone_ref(py),
                method,
                PyBytes::new(py, message),
                timeout.map(|t| t.as_secs_f64()),
                id,
                reply,
            );
            self.event_loop
                .call_method1(py, "call_soon_threadsafe", args)
                .map(|_| ())
        });
        if handed.is_err() {
            return status(UNAVAILABLE, "the server is shutting down");
        }
        let mut pending = Pending { bridge: self, id };
        let answer = receiver
            .await
            .unwrap_or_else(|_| status(INTERNAL, "the call was dropped without an answer"));
        pending.id = "";
        answer
    }

    pub fn log_rpc(&self, id: &str, method: usize, code: u8, took: Duration) {
        Python::with_gil(|py| {
            let args = (id, method, code, took.as_secs_f64());
            if let Err(error) = self.log_rpc.call1(py, args) {
                error.write_unraisable(py, None);
            }
        });
    }

    /// None when the client named so may call CloudProvider, else the denial.
    pub fn admit(&self, names: (Vec<String>, Vec<String>)) -> Option<String> {
        let admit = self.admit.as_ref()?;
        Python::with_gil(|py| match admit.call1(py, names) {
            Ok(decision) => decision.extract::<Option<String>>(py).unwrap_or(None),
            Err(error) => {
                error.write_unraisable(py, None);
                Some("the allowedClients check failed; see the server log".to_string())
            }
        })
    }

    pub fn tls_refused(&self, peer: std::net::SocketAddr, reason: String) {
        if let Some(refused) = &self.tls_refused {
            Python::with_gil(|py| {
                if let Err(error) = refused.call1(py, (peer.to_string(), reason)) {
                    error.write_unraisable(py, None);
                }
            });
        }
    }

    pub fn tls_check(&self) {
        if let Some(check) = &self.tls_check {
            Python::with_gil(|py| {
                if let Err(error) = check.call0(py) {
                    error.write_unraisable(py, None);
                }
            });
        }
    }
}

/// A forwarded call whose caller may give up: dropped before Python answered, it tells Python
/// to cancel the call's task, as a gRPC server cancels the handler of a call that is gone.
struct Pending<'a> {
    bridge: &'a Bridge,
    id: &'a str,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.id.is_empty() {
            return;
        }
        Python::with_gil(|py| {
            let args = (self.bridge.cancel.clone_ref(py), self.id);
            // Fails only when the loop is closed: then nothing runs that could be cancelled.
            let _ = self
                .bridge
                .event_loop
                .call_method1(py, "call_soon_threadsafe", args);
        });
    }
}
