//! What a call gets, and the gRPC status codes this crate answers with. Both the forwarding
//! (bridge.rs) and the serving (grpc.rs) build answers, so they live in neither.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

pub const OK: u8 = 0;
pub const CANCELLED: u8 = 1;
pub const DEADLINE_EXCEEDED: u8 = 4;
pub const PERMISSION_DENIED: u8 = 7;
pub const RESOURCE_EXHAUSTED: u8 = 8;
pub const UNIMPLEMENTED: u8 = 12;
pub const INTERNAL: u8 = 13;
pub const UNAVAILABLE: u8 = 14;

/// A serialized, already framed response, or a status.
#[derive(Clone)]
pub enum Answer {
    Ok(Bytes),
    Status(u8, Arc<str>),
}

pub fn status(code: u8, message: &str) -> Answer {
    Answer::Status(code, Arc::from(message))
}

/// A response message with gRPC's 5-byte prefix (uncompressed, length).
pub fn frame(message: &[u8]) -> Bytes {
    let mut framed = BytesMut::with_capacity(message.len() + 5);
    framed.put_u8(0);
    framed.put_u32(message.len() as u32);
    framed.put_slice(message);
    framed.freeze()
}
