//! Connections and the server's life: accept, TLS handshake, the per-connection
//! allowedClients decision, HTTP/2 (hyper) with its limits, health, reflection and
//! CloudProvider behind the gRPC wire rules, the idle timeout, the drain.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use pyo3::prelude::*;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::body::BoxBody;
use tonic::service::Routes;
use tonic_health::ServingStatus;
use tower_service::Service;

use crate::grpc::{wire_refusal, CloudProvider, Core, Peer, SERVICE};
use crate::tls::identity;

/// A slow or stalled client must not hold an accept slot forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

pub struct Io {
    stream: Stream,
}

macro_rules! delegate {
    ($self:ident, $stream:ident => $call:expr) => {
        match &mut $self.get_mut().stream {
            Stream::Plain($stream) => {
                let $stream = Pin::new($stream);
                $call
            }
            Stream::Tls($stream) => {
                let $stream = Pin::new($stream.as_mut());
                $call
            }
        }
    };
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_shutdown(cx))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}

type Tls = Option<Arc<ArcSwap<rustls::ServerConfig>>>;
type Stop = oneshot::Receiver<(Duration, PyObject)>;

/// Every connection's HTTP/2 limits (Python's transport/limits.py chooses the values).
pub struct ConnectionLimits {
    pub max_concurrent_streams: u32,
    pub max_header_list_bytes: u32,
    /// A connection without a stream for this long is sent GOAWAY (refused clients' too).
    pub idle_timeout: Duration,
    /// A PING after this long without a frame from the peer; no answer within
    /// `keepalive_timeout` closes the connection.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// Leader election: GOAWAY after this age, so clients find the new leader.
    pub max_connection_age: Option<Duration>,
}

/// What the serving thread needs besides the listener.
pub struct Setup {
    pub core: Arc<Core>,
    pub tls: Tls,
    pub limits: ConnectionLimits,
    /// Health status changes Python asks for: (service, serving).
    pub health: mpsc::UnboundedReceiver<(String, bool)>,
    pub stop: Stop,
}

/// Builds the services and serves on a thread of its own until told to stop. Reflection
/// decodes `descriptors` here and keeps what it decoded, not the bytes.
pub fn start(
    listener: std::net::TcpListener,
    descriptors: &[u8],
    setup: Setup,
) -> PyResult<JoinHandle<()>> {
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(descriptors)
        .build_v1alpha()
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let core = setup.core.clone();
    let thread = std::thread::Builder::new()
        .name("grpc-transport".into())
        .spawn(move || {
            let on_stopped = runtime.block_on(serve(listener, setup, reflection));
            // Every task (and what it holds of Python's) goes before Python hears of the stop:
            // once told, Python may finalize, and this thread must not need the GIL again.
            drop(runtime);
            // Stopped by Python (not dropped by it): nothing calls Python from here on, and
            // the server lets go of Python's callables (they hold the objects that hold it).
            if let Some(on_stopped) = on_stopped {
                Python::with_gil(|py| {
                    core.bridge.release(py);
                    if let Err(error) = on_stopped.call0(py) {
                        error.write_unraisable(py, None);
                    }
                });
            }
        })?;
    Ok(thread)
}

/// What every connection is served with.
struct Serving {
    routes: Routes,
    http2: http2::Builder<TokioExecutor>,
    idle_timeout: Duration,
    keepalive_timeout: Duration,
    max_connection_age: Option<Duration>,
    /// Becomes true when the server stops: every connection is sent GOAWAY.
    draining: watch::Receiver<bool>,
}

/// Serves until told to stop (or until the Python object is gone), then drains; returns
/// what to call once stopped.
async fn serve<R>(listener: std::net::TcpListener, setup: Setup, reflection: R) -> Option<PyObject>
where
    R: tower_service::Service<
            http::Request<BoxBody>,
            Response = http::Response<BoxBody>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + 'static,
    R::Future: Send + 'static,
{
    let Setup {
        core,
        tls,
        limits,
        mut health,
        stop,
        ..
    } = setup;
    let listener = TcpListener::from_std(listener).expect("inside the runtime");
    let (mut health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_service_status(SERVICE, ServingStatus::Serving)
        .await;
    let mut reporter = health_reporter.clone();
    let following = tokio::spawn(async move {
        while let Some((service, serving)) = health.recv().await {
            let status = if serving {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            reporter.set_service_status(service, status).await;
        }
    });
    let mut http2 = http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(limits.max_header_list_bytes)
        .keep_alive_interval(limits.keepalive_interval)
        .keep_alive_timeout(limits.keepalive_timeout);
    let (drain, draining) = watch::channel(false);
    let serving = Arc::new(Serving {
        routes: Routes::new(health_service)
            .add_service(reflection)
            .add_service(CloudProvider(core.clone()))
            .prepare(),
        http2,
        idle_timeout: limits.idle_timeout,
        keepalive_timeout: limits.keepalive_timeout,
        max_connection_age: limits.max_connection_age,
        draining,
    });
    let accepting = tokio::spawn(accept(listener, core, tls, serving));
    let (grace, on_stopped) = match stop.await {
        Ok((grace, on_stopped)) => (grace, Some(on_stopped)),
        Err(_) => (Duration::ZERO, None),
    };
    following.abort();
    for service in ["", SERVICE] {
        health_reporter
            .set_service_status(service, ServingStatus::NotServing)
            .await;
    }
    // Draining first: a connection whose handshake ends from now on is not served at all.
    let _ = drain.send(true);
    accepting.abort();
    let _ = accepting.await; // its hold on `draining` goes with it
                             // Every connection holds a receiver until it has ended; what is left after the grace is
                             // cut when the runtime is dropped.
    let _ = tokio::time::timeout(grace, drain.closed()).await;
    on_stopped
}

async fn accept(listener: TcpListener, core: Arc<Core>, tls: Tls, serving: Arc<Serving>) {
    loop {
        let Ok((tcp, address)) = listener.accept().await else {
            // Out of file descriptors and the like: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let Some(tls) = &tls else {
            let io = Io {
                stream: Stream::Plain(tcp),
            };
            tokio::spawn(connection(io, Peer::default(), serving.clone()));
            continue;
        };
        core.bridge.tls_check();
        let acceptor = TlsAcceptor::from(tls.load_full());
        let (core, serving) = (core.clone(), serving.clone());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                // The client sees the handshake fail; the operator sees why in the log.
                Ok(Err(error)) => return core.bridge.tls_refused(address, error.to_string()),
                Err(_) => {
                    let reason = format!("no TLS handshake within {HANDSHAKE_TIMEOUT:?}");
                    return core.bridge.tls_refused(address, reason);
                }
            };
            let leaf = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first());
            let names = leaf.map(identity).unwrap_or_default();
            let denial = core.bridge.admit(names).map(Arc::from);
            let io = Io {
                stream: Stream::Tls(Box::new(stream)),
            };
            connection(io, Peer { denial }, serving).await;
        });
    }
}

/// Serves one connection until the client closes it, or until it is idle, too old or the
/// server stops: then GOAWAY, and the streams in flight finish.
async fn connection(io: Io, peer: Peer, serving: Arc<Serving>) {
    if *serving.draining.borrow() {
        // Accepted before the server stopped, ready after: closed unserved, as a connection
        // attempt after the stop is refused. Serving it even until the GOAWAY could start a
        // call the drain promised not to take.
        return;
    }
    let streams = Arc::new(Streams::new());
    let service = Connection {
        routes: serving.routes.clone(),
        peer,
        streams: streams.clone(),
    };
    let conn = serving.http2.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut draining = serving.draining.clone();
    let age = async {
        match serving.max_connection_age {
            Some(age) => tokio::time::sleep(age).await,
            None => std::future::pending().await,
        }
    };
    // The stop is seen before the connection's next frames: a call the client sends after
    // it is refused by the GOAWAY, not started.
    let idle = tokio::select! {
        biased;
        _ = draining.wait_for(|&stopping| stopping) => false,
        _ = &mut conn => return,
        _ = streams.idle(serving.idle_timeout) => true,
        _ = age => false,
    };
    conn.as_mut().graceful_shutdown();
    if !idle {
        let _ = conn.await; // the calls in flight finish (the drain has its own grace)
        return;
    }
    // h2 closes once its GOAWAY's PING is answered: a peer that never answers it is not
    // waited for longer than for any other PING.
    let _ = tokio::time::timeout(serving.keepalive_timeout, conn).await;
}

/// A connection's open streams, and since when it has had none.
struct Streams {
    base: Instant,
    open: AtomicUsize,
    /// Nanoseconds after `base` when the last stream closed.
    quiet_from: AtomicU64,
}

impl Streams {
    fn new() -> Streams {
        Streams {
            base: Instant::now(),
            open: AtomicUsize::new(0),
            quiet_from: AtomicU64::new(0),
        }
    }

    fn open(self: &Arc<Self>) -> Open {
        self.open.fetch_add(1, Relaxed);
        Open(self.clone())
    }

    /// Since when no stream is open; None while one is.
    fn quiet_since(&self) -> Option<Instant> {
        if self.open.load(Relaxed) > 0 {
            return None;
        }
        Some(self.base + Duration::from_nanos(self.quiet_from.load(Relaxed)))
    }

    /// Returns once no stream has been open for `timeout`. Wakes at most once per `timeout`:
    /// opening and closing streams costs the calls nothing but two counters.
    async fn idle(&self, timeout: Duration) {
        loop {
            let wake = self.quiet_since().unwrap_or_else(Instant::now) + timeout;
            tokio::time::sleep_until(wake.into()).await;
            if self
                .quiet_since()
                .is_some_and(|since| since + timeout <= Instant::now())
            {
                return;
            }
        }
    }
}

/// One open stream: counted from its request until its response is sent or it is reset.
struct Open(Arc<Streams>);

impl Drop for Open {
    fn drop(&mut self) {
        let quiet = u64::try_from(self.0.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.0.quiet_from.store(quiet, Relaxed);
        self.0.open.fetch_sub(1, Relaxed);
    }
}

/// A response body that keeps its stream counted as open until it is dropped.
struct Counted {
    body: BoxBody,
    _open: Open,
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The per-connection service: the wire rules, then health, reflection or CloudProvider,
/// each request knowing its connection's peer.
#[derive(Clone)]
struct Connection {
    routes: Routes,
    peer: Peer,
    streams: Arc<Streams>,
}

impl hyper::service::Service<http::Request<Incoming>> for Connection {
    type Response = http::Response<Counted>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn call(&self, request: http::Request<Incoming>) -> Self::Future {
        let open = self.streams.open();
        if let Some(refusal) = wire_refusal(&request) {
            let response = refusal.map(|body| Counted { body, _open: open });
            return Box::pin(std::future::ready(Ok(response)));
        }
        let mut request = request.map(tonic::body::boxed);
        request.extensions_mut().insert(self.peer.clone());
        let answered = self.routes.clone().call(request);
        Box::pin(async move {
            let response = answered.await?;
            Ok(response.map(|body| Counted { body, _open: open }))
        })
    }
}
