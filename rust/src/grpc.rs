//! The CloudProvider service as one tower service: unary gRPC framing by hand (the payload
//! stays raw bytes), routing by method path, the hot answers, and forwarding to Python.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{ALLOW, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::sync::{Semaphore, SemaphorePermit};
use tonic::body::BoxBody;
use tonic::server::NamedService;

use crate::answer::{
    status, Answer, CANCELLED, DEADLINE_EXCEEDED, INTERNAL, OK, PERMISSION_DENIED,
    RESOURCE_EXHAUSTED, UNIMPLEMENTED,
};
use crate::bridge::Bridge;
use crate::snapshot::{Hot, Snapshot};
use crate::stats::Stats;

pub const SERVICE: &str = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider";
/// CA's DeleteNodes carries whole node objects; gRPC's default 4 MiB is too small for it.
pub const MAX_RECEIVE_BYTES: usize = 16 * 1024 * 1024;

const HEADSTART: Duration = Duration::from_millis(1);

/// What Python chose to bound a call's request by (see transport/limits.py).
pub struct RequestLimits {
    /// Request message bytes being received or handled at once, over all calls.
    pub receive_budget_bytes: u32,
    /// How long a call's request may take to arrive whole, whatever its deadline.
    pub body_timeout: Duration,
}

/// Per connection: None when the client may call CloudProvider, else why not.
#[derive(Clone, Default)]
pub struct Peer {
    pub denial: Option<Arc<str>>,
}

/// Until when this replica serves (leader election): hot answers only while it does; a call
/// outside goes to Python, whose gate refuses it with the reason.
pub struct Gate {
    base: Instant,
    /// Nanoseconds after `base`; u64::MAX: always (no leader election).
    until: AtomicU64,
}

impl Gate {
    pub fn serve_for(&self, seconds: f64) {
        let until = if seconds == f64::INFINITY {
            u64::MAX
        } else {
            let from_now = Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or(Duration::ZERO);
            let at = self.base.elapsed() + from_now;
            u64::try_from(at.as_nanos()).unwrap_or(u64::MAX - 1)
        };
        self.until.store(until, Relaxed);
    }

    fn open(&self) -> bool {
        let until = self.until.load(Relaxed);
        until == u64::MAX || (self.base.elapsed().as_nanos() as u64) < until
    }
}

pub struct Core {
    pub by_path: HashMap<String, usize>,
    pub gate: Gate,
    pub hot: Vec<Option<Hot>>,
    pub snapshot: Snapshot,
    pub stats: Stats,
    pub bridge: Bridge,
    pub debug: AtomicBool,
    request_ids: AtomicU64,
    id_prefix: String,
    /// One permit per request byte: a request holds its bytes' permits from its length
    /// prefix until its answer, so what requests occupy at once stays under the budget.
    budget: Semaphore,
    budget_bytes: u32,
    body_timeout: Duration,
}

impl Core {
    /// `serving`: the gate starts open for good, else closed until `serve_for`.
    pub fn new(
        methods: &[String],
        bounds: Vec<f64>,
        bridge: Bridge,
        id_prefix: String,
        serving: bool,
        limits: RequestLimits,
    ) -> Core {
        Core {
            by_path: methods
                .iter()
                .enumerate()
                .map(|(i, name)| (format!("/{SERVICE}/{name}"), i))
                .collect(),
            hot: methods.iter().map(|name| Hot::from_method(name)).collect(),
            gate: Gate {
                base: Instant::now(),
                until: AtomicU64::new(if serving { u64::MAX } else { 0 }),
            },
            snapshot: Snapshot::default(),
            stats: Stats::new(methods.len(), bounds),
            bridge,
            debug: AtomicBool::new(false),
            request_ids: AtomicU64::new(0),
            id_prefix,
            budget: Semaphore::new(limits.receive_budget_bytes as usize),
            budget_bytes: limits.receive_budget_bytes,
            body_timeout: limits.body_timeout,
        }
    }

    async fn handle(&self, request: Request<BoxBody>) -> Response<BoxBody> {
        let started = Instant::now();
        let Some(&method) = self.by_path.get(request.uri().path()) else {
            return status_response(UNIMPLEMENTED, "Method not found!");
        };
        let id = format!(
            "{}-{}",
            self.id_prefix,
            self.request_ids.fetch_add(1, Relaxed) + 1
        );
        let answer = self.answer(method, &id, request, started).await;
        let code = match &answer {
            Answer::Ok(_) => OK,
            Answer::Status(code, _) => *code,
        };
        let took = started.elapsed();
        self.stats.observe(method, code, took);
        if self.debug.load(Relaxed) {
            self.bridge.log_rpc(&id, method, code, took);
        }
        match answer {
            Answer::Ok(framed) => ok_response(framed),
            Answer::Status(code, message) => status_response(code, &message),
        }
    }

    async fn answer(
        &self,
        method: usize,
        id: &str,
        request: Request<BoxBody>,
        started: Instant,
    ) -> Answer {
        if let Some(denial) = request
            .extensions()
            .get::<Peer>()
            .and_then(|p| p.denial.clone())
        {
            return Answer::Status(PERMISSION_DENIED, denial);
        }
        // The caller's deadline runs from when its call arrived, reading a large body included.
        // Answered a moment before tonic's own deadline timer would end the call as CANCELLED:
        // an expired deadline is DEADLINE_EXCEEDED, as from any gRPC server.
        // A deadline too far off to represent is no deadline.
        let deadline = match grpc_timeout(request.headers()) {
            Ok(timeout) => timeout.and_then(|t| started.checked_add(t.saturating_sub(HEADSTART))),
            Err(refusal) => return refusal,
        };
        let encoded = request.headers().contains_key("grpc-encoding");
        let reading = tokio::time::timeout(
            self.body_timeout,
            self.read_message(request.into_body(), encoded),
        );
        let body_timeout = || {
            let message = format!(
                "the request message did not arrive whole within {:?}",
                self.body_timeout
            );
            Err(status(DEADLINE_EXCEEDED, &message))
        };
        let reading = async { reading.await.unwrap_or_else(|_| body_timeout()) };
        // Held until the answer: Python's copy and decoding of the message count too.
        let (message, _budget) = match before(deadline, reading).await {
            Ok(read) => read,
            Err(refusal) => return refusal,
        };
        // Not while Python still runs a call that may change state and whose caller gave up on
        // it (Python publishes when the call ends): CA's next call must see that change.
        let prepared = |_: &Hot| self.gate.open() && self.bridge.settled();
        if let Some(hot) = self.hot[method].filter(prepared) {
            if let Some(answer) = self.snapshot.answer(hot, &message) {
                return answer;
            }
        }
        // Python is told the time left, not the caller's whole timeout.
        let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        // The hot RPCs only read; any other call may change what their answers say.
        let may_change_state = self.hot[method].is_none();
        // Only a memoized answer needs the request kept once Python has its copy.
        let key = self.hot[method].map(|hot| (hot, message.clone()));
        let forwarded = self
            .bridge
            .forward(method, message, remaining, id, may_change_state);
        let answer = match before(deadline, async { Ok(forwarded.await) }).await {
            Ok(answer) | Err(answer) => answer,
        };
        if let Some((hot, message)) = key {
            self.snapshot.remember(hot, message, &answer);
        }
        answer
    }

    /// Reads the one request message: its 5-byte prefix first, which refuses a compressed
    /// or too large message at once, then the message itself within the receive budget.
    async fn read_message(
        &self,
        mut body: BoxBody,
        encoded: bool,
    ) -> Result<(Bytes, SemaphorePermit<'_>), Answer> {
        let mut prefix = BytesMut::with_capacity(5);
        let mut rest = Bytes::new();
        while prefix.len() < 5 {
            let Some(data) = next_data(&mut body).await? else {
                return Err(status(INTERNAL, "no request message"));
            };
            let take = data.len().min(5 - prefix.len());
            prefix.extend_from_slice(&data[..take]);
            rest = data.slice(take..);
        }
        let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]);
        if prefix[0] != 0 {
            return Err(compressed(encoded));
        }
        if length as usize > MAX_RECEIVE_BYTES {
            let message =
                format!("Received message larger than max ({length} vs. {MAX_RECEIVE_BYTES})");
            return Err(status(RESOURCE_EXHAUSTED, &message));
        }
        // Not waited for: a queue would hold small calls behind large ones.
        let permit = self.budget.try_acquire_many(length).map_err(|_| {
            let taken = self.budget_bytes as usize - self.budget.available_permits();
            let message = format!(
                "request message of {length} bytes refused: requests being received or \
                 handled hold {taken} of the server's {} bytes; retry later",
                self.budget_bytes
            );
            status(RESOURCE_EXHAUSTED, &message)
        })?;
        let mut message = BytesMut::with_capacity(length as usize);
        let mut data = rest;
        loop {
            if message.len() + data.len() > length as usize {
                return Err(status(
                    INTERNAL,
                    "more than one request message in a unary call",
                ));
            }
            message.put(&mut data);
            match next_data(&mut body).await? {
                Some(next) => data = next,
                None => break,
            }
        }
        if message.len() != length as usize {
            return Err(status(INTERNAL, "the request message was cut off"));
        }
        Ok((message.freeze(), permit))
    }
}

/// The body's next data frame; None at its end.
async fn next_data(body: &mut BoxBody) -> Result<Option<Bytes>, Answer> {
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Err(status(CANCELLED, "the request body was cut off"));
        };
        if let Ok(data) = frame.into_data() {
            if data.has_remaining() {
                return Ok(Some(data));
            }
        }
    }
    Ok(None)
}

/// A compressed message: this server negotiates no compression. As grpc-go answers: without
/// a grpc-encoding the flag contradicts the call (INTERNAL); with one, it is unsupported.
fn compressed(encoded: bool) -> Answer {
    if encoded {
        status(
            UNIMPLEMENTED,
            "compressed request messages are not supported (no grpc-encoding is accepted)",
        )
    } else {
        status(
            INTERNAL,
            "compressed flag set in a request message without a grpc-encoding",
        )
    }
}

/// `work`'s outcome, or DEADLINE_EXCEEDED once `deadline` has passed (dropping `work`).
async fn before<T>(
    deadline: Option<Instant>,
    work: impl Future<Output = Result<T, Answer>>,
) -> Result<T, Answer> {
    let expired = || Err(status(DEADLINE_EXCEEDED, "Deadline Exceeded"));
    match deadline {
        None => work.await,
        // Not even started: a timer polls `work` once before it looks at the clock.
        Some(deadline) if Instant::now() >= deadline => expired(),
        Some(deadline) => tokio::time::timeout_at(deadline.into(), work)
            .await
            .unwrap_or_else(|_| expired()),
    }
}

/// The caller's `grpc-timeout` (at most 8 digits and a unit, e.g. `4999m`), if any. Anything
/// else ends the call INTERNAL naming the value, as grpc-go's server does.
fn grpc_timeout(headers: &HeaderMap) -> Result<Option<Duration>, Answer> {
    let Some(header) = headers.get("grpc-timeout") else {
        return Ok(None);
    };
    let malformed = |why: &str| {
        let value = String::from_utf8_lossy(header.as_bytes());
        Err(status(
            INTERNAL,
            &format!("malformed grpc-timeout {value:?}: {why}"),
        ))
    };
    let value = header.to_str().unwrap_or("");
    let Some(split) = value.len().checked_sub(1).filter(|&s| s > 0) else {
        return malformed("expected 1 to 8 digits and a unit (H, M, S, m, u or n)");
    };
    let (digits, unit) = value.split_at(split);
    if digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return malformed("expected 1 to 8 digits and a unit (H, M, S, m, u or n)");
    }
    let amount: u64 = digits.parse().unwrap_or(0); // 8 digits always fit
    Ok(Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return malformed("expected 1 to 8 digits and a unit (H, M, S, m, u or n)"),
    }))
}

/// grpc-message's percent-encoding: printable ASCII except '%' stays as is.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn grpc_headers(response: &mut Response<BoxBody>) {
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
}

fn ok_response(framed: Bytes) -> Response<BoxBody> {
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let body = Unary {
        data: Some(framed),
        trailers: Some(trailers),
    };
    let mut response = Response::new(tonic::body::boxed(body));
    grpc_headers(&mut response);
    response
}

/// The gRPC-over-HTTP/2 rules a request must follow to be routed at all: POST with a
/// content-type of application/grpc or application/grpc+proto (parameters allowed). What
/// breaks them gets the HTTP status the spec names, with a gRPC status for gRPC clients.
pub fn wire_refusal<B>(request: &Request<B>) -> Option<Response<BoxBody>> {
    if request.method() != Method::POST {
        let message = format!(
            "method {} is not allowed: gRPC calls are POST",
            request.method()
        );
        let mut response = status_response(INTERNAL, &message);
        *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("POST"));
        return Some(response);
    }
    let content_type = request.headers().get(CONTENT_TYPE);
    if content_type.is_some_and(|value| is_grpc(value.as_bytes())) {
        return None;
    }
    let named = content_type.map_or("none".to_string(), |value| {
        format!("{:?}", String::from_utf8_lossy(value.as_bytes()))
    });
    let message = format!(
        "content-type {named} is not served: expected application/grpc or application/grpc+proto"
    );
    let mut response = status_response(INTERNAL, &message);
    *response.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
    Some(response)
}

fn is_grpc(content_type: &[u8]) -> bool {
    let media_type = content_type
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default();
    let media_type = media_type.trim_ascii();
    media_type.eq_ignore_ascii_case(b"application/grpc")
        || media_type.eq_ignore_ascii_case(b"application/grpc+proto")
}

/// A trailers-only response: the status travels in the headers, the body is empty.
fn status_response(code: u8, message: &str) -> Response<BoxBody> {
    let mut response = Response::new(tonic::body::empty_body());
    grpc_headers(&mut response);
    let headers = response.headers_mut();
    headers.insert("grpc-status", HeaderValue::from(u16::from(code)));
    if let Ok(value) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert("grpc-message", value);
    }
    response
}

/// One data frame, then the trailers.
struct Unary {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for Unary {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

#[derive(Clone)]
pub struct CloudProvider(pub Arc<Core>);

impl NamedService for CloudProvider {
    const NAME: &'static str = SERVICE;
}

impl tower_service::Service<Request<BoxBody>> for CloudProvider {
    type Response = Response<BoxBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<BoxBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<BoxBody>) -> Self::Future {
        let core = self.0.clone();
        Box::pin(async move { Ok(core.handle(request).await) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(value: &'static str) -> Result<Option<Duration>, String> {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-timeout", HeaderValue::from_static(value));
        grpc_timeout(&headers).map_err(|answer| match answer {
            Answer::Status(code, message) => format!("{code} {message}"),
            Answer::Ok(_) => String::new(),
        })
    }

    #[test]
    fn timeouts_and_messages() {
        assert_eq!(grpc_timeout(&HeaderMap::new()).ok(), Some(None));
        assert_eq!(timeout("4999m"), Ok(Some(Duration::from_millis(4999))));
        assert_eq!(
            timeout("99999999H"),
            Ok(Some(Duration::from_secs(99_999_999 * 3600)))
        );
        for bad in [
            "7x",
            "",
            "S",
            "123456789S",
            "10000000000000000000S",
            "-1S",
            "+1S",
        ] {
            let refusal = timeout(bad).expect_err(bad);
            assert!(
                refusal.starts_with(&format!("13 malformed grpc-timeout {bad:?}")),
                "{refusal}"
            );
        }
        assert_eq!(percent_encode("a 100% 'ü'\n"), "a 100%25 '%C3%BC'%0A");
    }

    #[test]
    fn grpc_content_types() {
        for served in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC; charset=utf-8",
            "application/grpc+proto ;x=y",
        ] {
            assert!(is_grpc(served.as_bytes()), "{served}");
        }
        for refused in [
            "",
            "text/plain",
            "application/grpc+json",
            "application/grpcx",
            "application/grpc-web",
        ] {
            assert!(!is_grpc(refused.as_bytes()), "{refused}");
        }
    }
}
