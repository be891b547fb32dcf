//! cloudscale_autoscaler._transport: the gRPC server (tonic, rustls) inside the Python process.
//!
//! It owns the port: CloudProvider, grpc health and reflection, mutual TLS. The hot read-only
//! RPCs are answered from a snapshot Python publishes; every other call, and any miss, is
//! forwarded to Python's asyncio loop. Python decides everything; this module serves it.

mod answer;
mod bridge;
mod grpc;
mod io;
mod snapshot;
mod stats;
mod tls;
mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use tokio::sync::oneshot;

use crate::answer::{frame, status, Answer};
use crate::bridge::{Bridge, Hooks};
use crate::grpc::Core;
use crate::snapshot::{Hot, NodeIndex, Table};

/// One running server; Python's transport/server.py wraps it.
#[pyclass(frozen)]
struct Server {
    core: Arc<grpc::Core>,
    tls: Option<Arc<ArcSwap<rustls::ServerConfig>>>,
    stop: Mutex<Option<oneshot::Sender<(Duration, PyObject)>>>,
    health: tokio::sync::mpsc::UnboundedSender<(String, bool)>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    #[pyo3(get)]
    port: u16,
}

fn tls_config(pems: (Vec<u8>, Vec<u8>, Vec<u8>)) -> PyResult<rustls::ServerConfig> {
    tls::server_config(&pems.0, &pems.1, &pems.2).map_err(|r| PyValueError::new_err(r.to_string()))
}

/// Builds the server configuration `Server` would serve these PEM files with, and drops it:
/// raises ValueError((file, reason)) for what rustls refuses, so Python's checks refuse it too.
#[pyfunction]
fn check_tls(cert: &[u8], key: &[u8], client_ca: &[u8]) -> PyResult<()> {
    tls::server_config(cert, key, client_ca)
        .map(drop)
        .map_err(|r| PyValueError::new_err((r.file, r.reason)))
}

/// The hot RPC `method` names, or a ValueError naming it.
fn hot_method(method: &str) -> PyResult<Hot> {
    Hot::from_method(method)
        .ok_or_else(|| PyValueError::new_err(format!("{method} is not answered here")))
}

#[pymethods]
impl Server {
    /// Binds `listen` and starts serving on a thread of its own; the hot answers are served
    /// from the start if `serving`, else not until `set_serving_for` (leader election).
    #[new]
    #[pyo3(signature = (listen, methods, buckets, descriptors, tls, hooks, id_prefix, limits, max_connection_age, serving))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        listen: &str,
        methods: Vec<String>,
        buckets: Vec<f64>,
        descriptors: Vec<u8>,
        tls: Option<(Vec<u8>, Vec<u8>, Vec<u8>)>,
        hooks: &Bound<'_, PyAny>,
        id_prefix: String,
        limits: &Bound<'_, PyAny>,
        max_connection_age: Option<f64>,
        serving: bool,
    ) -> PyResult<Server> {
        let seconds = |name: &str| -> PyResult<Duration> {
            let value: f64 = limits.getattr(name)?.extract()?;
            Duration::try_from_secs_f64(value)
                .map_err(|_| PyValueError::new_err(format!("{name}: {value} is no duration")))
        };
        let optional = |name: &str| -> PyResult<Option<PyObject>> {
            let value = hooks.getattr(name)?;
            Ok((!value.is_none()).then(|| value.unbind()))
        };
        let tls_pace = bridge::Pace::new(
            Duration::try_from_secs_f64(hooks.getattr("tls_check_interval")?.extract()?)
                .unwrap_or(Duration::ZERO),
        );
        let hooks = Hooks {
            event_loop: hooks.getattr("event_loop")?.unbind(),
            dispatch: hooks.getattr("dispatch")?.unbind(),
            cancel: hooks.getattr("cancel")?.unbind(),
            log_rpc: hooks.getattr("log_rpc")?.unbind(),
            admit: optional("admit")?,
            tls_check: optional("tls_check")?,
            tls_refused: optional("tls_refused")?,
        };
        let bridge = Bridge::new(hooks, tls_pace);
        let tls = tls
            .map(|pems| tls_config(pems).map(|c| Arc::new(ArcSwap::from_pointee(c))))
            .transpose()?;
        let request_limits = grpc::RequestLimits {
            receive_budget_bytes: limits.getattr("receive_budget_bytes")?.extract()?,
            body_timeout: seconds("body_timeout")?,
        };
        let core = Arc::new(Core::new(
            &methods,
            buckets,
            bridge,
            id_prefix,
            serving,
            request_limits,
        ));
        let listener = std::net::TcpListener::bind(listen)
            .map_err(|e| PyOSError::new_err(format!("cannot bind ({e})")))?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let (stop, stopped) = oneshot::channel();
        let (health, health_changes) = tokio::sync::mpsc::unbounded_channel();
        let setup = io::Setup {
            core: core.clone(),
            tls: tls.clone(),
            limits: io::ConnectionLimits {
                max_concurrent_streams: limits.getattr("max_concurrent_streams")?.extract()?,
                max_header_list_bytes: limits.getattr("max_header_list_bytes")?.extract()?,
                idle_timeout: seconds("idle_timeout")?,
                keepalive_interval: seconds("keepalive_interval")?,
                keepalive_timeout: seconds("keepalive_timeout")?,
                max_connection_age: max_connection_age
                    .and_then(|s| Duration::try_from_secs_f64(s).ok()),
            },
            health: health_changes,
            stop: stopped,
        };
        let thread = io::start(listener, &descriptors, setup)?;
        Ok(Server {
            core,
            tls,
            stop: Mutex::new(Some(stop)),
            thread: Mutex::new(Some(thread)),
            health,
            port,
        })
    }

    /// New TLS material for the connections accepted from now on.
    fn set_tls(&self, cert: Vec<u8>, key: Vec<u8>, client_ca: Vec<u8>) -> PyResult<()> {
        let Some(current) = &self.tls else {
            return Err(PyValueError::new_err("this server serves without TLS"));
        };
        current.store(Arc::new(tls_config((cert, key, client_ca))?));
        Ok(())
    }

    /// gRPC health's status of `service` ("" is the whole server).
    fn set_health(&self, service: String, serving: bool) {
        let _ = self.health.send((service, serving)); // gone once stopped: nothing to tell
    }

    /// Hot answers for `seconds` from now on (inf: always; 0 or less: not until told).
    fn set_serving_for(&self, seconds: f64) {
        self.core.gate.serve_for(seconds);
    }

    fn set_debug(&self, on: bool) {
        self.core
            .debug
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// NodeGroupForNode's answers: providerID -> serialized response, and the "not ours" one.
    fn publish_node_index(&self, index: &Bound<'_, PyDict>, not_managed: &[u8]) -> PyResult<()> {
        // Many keys share one response object: frame each distinct object once.
        let mut framed: HashMap<usize, bytes::Bytes> = HashMap::new();
        let mut by_provider_id = HashMap::with_capacity(index.len());
        for (key, value) in index.iter() {
            let value = value.downcast_into::<PyBytes>()?;
            let answer = framed
                .entry(value.as_ptr() as usize)
                .or_insert_with(|| frame(value.as_bytes()))
                .clone();
            by_provider_id.insert(key.extract::<String>()?, answer);
        }
        self.core.snapshot.set_index(NodeIndex {
            by_provider_id,
            not_managed: frame(not_managed),
        });
        Ok(())
    }

    /// One hot RPC's answers by group id ("" for NodeGroups and GPULabel): serialized
    /// response bytes, or a (status code, message) tuple. Replaces that RPC's table.
    fn publish_answers(&self, method: &str, answers: &Bound<'_, PyDict>) -> PyResult<()> {
        let hot = hot_method(method)?;
        let mut table = Table::with_capacity(answers.len());
        for (key, value) in answers.iter() {
            let answer = if let Ok(message) = value.downcast::<PyBytes>() {
                Answer::Ok(frame(message.as_bytes()))
            } else {
                let (code, message): (u8, String) = value.downcast::<PyTuple>()?.extract()?;
                status(code, &message)
            };
            table.insert(key.extract::<String>()?, answer);
        }
        self.core.snapshot.set_table(hot, table);
        Ok(())
    }

    /// Drops what was published for `method`: its calls go to Python until it is published
    /// again (Python could not prepare its answers, and old ones must not be served).
    fn withdraw(&self, method: &str) -> PyResult<()> {
        let hot = hot_method(method)?;
        self.core.snapshot.withdraw(hot);
        Ok(())
    }

    /// From now on, OK answers Python gives to `method` are kept by request bytes and served
    /// again for the same bytes: Python declares them a pure function of the request.
    fn memoize(&self, method: &str) -> PyResult<()> {
        let hot = hot_method(method)?;
        self.core.snapshot.set_memoized(hot);
        Ok(())
    }

    /// Per method index: (count per status code, observations per bucket, sum of seconds).
    fn rpc_stats(&self, method: usize) -> PyResult<stats::Reading> {
        if method >= self.core.hot.len() {
            return Err(PyValueError::new_err("no such method"));
        }
        Ok(self.core.stats.read(method))
    }

    /// Waits for the server's thread to end (after `on_stopped` was called). Python must not
    /// finalize before: the thread still returns from that call, which needs the GIL.
    fn join(&self, py: Python<'_>) {
        let thread = self.thread.lock().map(|mut t| t.take()).unwrap_or(None);
        if let Some(thread) = thread {
            let _ = py.allow_threads(|| thread.join());
        }
    }

    /// Health NOT_SERVING, no new connections, in-flight calls get `grace` seconds; then the
    /// server lets go of the hooks it was given and `on_stopped()` is called (from the
    /// server's thread).
    fn stop(&self, grace: f64, on_stopped: PyObject) -> PyResult<()> {
        let sender = self.stop.lock().map(|mut s| s.take()).unwrap_or(None);
        let Some(sender) = sender else {
            return Err(PyValueError::new_err("already stopping"));
        };
        let grace = Duration::try_from_secs_f64(grace.max(0.0)).unwrap_or(Duration::MAX);
        let _ = sender.send((grace, on_stopped));
        Ok(())
    }
}

#[pymodule]
fn _transport(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Server>()?;
    module.add_class::<bridge::Reply>()?;
    module.add_function(wrap_pyfunction!(check_tls, module)?)?;
    module.add("MAX_RECEIVE_BYTES", grpc::MAX_RECEIVE_BYTES)?;
    Ok(())
}
