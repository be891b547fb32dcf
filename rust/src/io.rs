//! Connections and the server's life: accept, TLS handshake, the per-connection
//! allowedClients decision, tonic serving health, reflection and CloudProvider, the drain.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use arc_swap::ArcSwap;
use pyo3::prelude::*;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tonic_health::ServingStatus;

use crate::grpc::{CloudProvider, Core, Peer, SERVICE};
use crate::tls::identity;

/// A slow or stalled client must not hold an accept slot forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

pub struct Io {
    stream: Stream,
    peer: Peer,
}

impl Connected for Io {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
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

/// What the serving thread needs besides the listener.
pub struct Setup {
    pub core: Arc<Core>,
    pub tls: Tls,
    pub descriptors: &'static [u8],
    pub max_connection_age: Option<Duration>,
    /// Health status changes Python asks for: (service, serving).
    pub health: mpsc::UnboundedReceiver<(String, bool)>,
    pub stop: Stop,
}

/// Builds the services and serves on a thread of its own until told to stop.
pub fn start(listener: std::net::TcpListener, setup: Setup) -> PyResult<JoinHandle<()>> {
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(setup.descriptors)
        .build_v1alpha()
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let thread = std::thread::Builder::new()
        .name("grpc-transport".into())
        .spawn(move || {
            let on_stopped = runtime.block_on(serve(listener, setup, reflection));
            // Every task (and what it holds of Python's) goes before Python hears of the stop:
            // once told, Python may finalize, and this thread must not need the GIL again.
            drop(runtime);
            if let Some(on_stopped) = on_stopped {
                Python::with_gil(|py| {
                    if let Err(error) = on_stopped.call0(py) {
                        error.write_unraisable(py, None);
                    }
                });
            }
        })?;
    Ok(thread)
}

/// Serves until told to stop (or until the Python object is gone), then drains; returns
/// what to call once stopped.
async fn serve<R>(listener: std::net::TcpListener, setup: Setup, reflection: R) -> Option<PyObject>
where
    R: tower_service::Service<
            http::Request<tonic::body::BoxBody>,
            Response = http::Response<tonic::body::BoxBody>,
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
        max_connection_age,
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
    let (connections, incoming) = mpsc::channel(64);
    let accepting = tokio::spawn(accept(listener, core.clone(), tls, connections));
    let (drain, draining) = oneshot::channel::<()>();
    let mut builder = tonic::transport::Server::builder();
    if let Some(age) = max_connection_age {
        builder = builder.max_connection_age(age);
    }
    let serving = tokio::spawn(
        builder
            .add_service(health_service)
            .add_service(reflection)
            .add_service(CloudProvider(core))
            .serve_with_incoming_shutdown(ReceiverStream::new(incoming), async {
                let _ = draining.await;
            }),
    );
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
    accepting.abort();
    let _ = drain.send(());
    let abort = serving.abort_handle();
    if tokio::time::timeout(grace, serving).await.is_err() {
        abort.abort(); // the grace is over: cut what is still running
    }
    on_stopped
}

async fn accept(
    listener: TcpListener,
    core: Arc<Core>,
    tls: Tls,
    connections: mpsc::Sender<Result<Io, io::Error>>,
) {
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
                peer: Peer::default(),
            };
            if connections.send(Ok(io)).await.is_err() {
                return;
            }
            continue;
        };
        core.bridge.tls_check();
        let acceptor = TlsAcceptor::from(tls.load_full());
        let (core, connections) = (core.clone(), connections.clone());
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
                peer: Peer { denial },
            };
            let _ = connections.send(Ok(io)).await;
        });
    }
}
