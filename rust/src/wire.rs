//! Just enough protobuf to read the few request fields the hot path needs.
//!
//! Every reader is strict and schema-bound: a field it does not know, a wire type it does not
//! expect or bytes that do not parse make it return `None`, and the call goes to Python, whose
//! protobuf runtime gives the exact answer (INVALID_ARGUMENT for bytes that are no message).
//! So a request is answered here only when it certainly parses.

/// One field of a message: its number and value.
enum Value<'a> {
    Varint,
    Fixed,
    Bytes(&'a [u8]),
}

fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..70).step_by(7) {
        let (&byte, rest) = buf.split_first()?;
        *buf = rest;
        if shift == 63 && byte > 1 {
            return None;
        }
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// Calls `each(number, value)` for every field; `None` if the bytes are no message or
/// `each` refuses a field.
fn fields<'a>(mut buf: &'a [u8], mut each: impl FnMut(u64, Value<'a>) -> Option<()>) -> Option<()> {
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        let number = key >> 3;
        if number == 0 || number > (1 << 29) - 1 {
            return None;
        }
        let value = match key & 7 {
            0 => varint(&mut buf).map(|_| Value::Varint)?,
            1 | 5 => {
                let width = if key & 7 == 1 { 8 } else { 4 };
                buf = buf.get(width..)?;
                Value::Fixed
            }
            2 => {
                let len = usize::try_from(varint(&mut buf)?).ok()?;
                let (data, rest) = (buf.get(..len)?, &buf[len..]);
                buf = rest;
                Value::Bytes(data)
            }
            _ => return None, // groups: not in our protos
        };
        each(number, value)?;
    }
    Some(())
}

fn string(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// A message made of string fields only (a map entry: key 1, value 2).
fn strings_only(buf: &[u8], known: &[u64]) -> Option<()> {
    fields(buf, |number, value| match value {
        Value::Bytes(data) if known.contains(&number) => string(data).map(|_| ()),
        _ => None,
    })
}

/// A message made of varint fields `known` only (both Duration types).
fn varints_only(buf: &[u8], known: &[u64]) -> Option<()> {
    fields(buf, |number, value| match value {
        Value::Varint if known.contains(&number) => Some(()),
        _ => None,
    })
}

/// A request whose only field is the string `id = 1` (NodeGroupTargetSizeRequest,
/// NodeGroupTemplateNodeInfoRequest).
pub fn group_id(buf: &[u8]) -> Option<&str> {
    let mut id = "";
    fields(buf, |number, value| match (number, value) {
        (1, Value::Bytes(data)) => string(data).map(|s| id = s),
        _ => None,
    })?;
    Some(id)
}

/// An empty request message (NodeGroupsRequest, GPULabelRequest).
pub fn empty(buf: &[u8]) -> Option<()> {
    buf.is_empty().then_some(())
}

/// NodeGroupForNodeRequest: `node = 1` (ExternalGrpcNode), its `providerID = 1`.
pub fn provider_id(buf: &[u8]) -> Option<&str> {
    let mut id = "";
    fields(buf, |number, value| match (number, value) {
        (1, Value::Bytes(node)) => fields(node, |number, value| match (number, value) {
            (1, Value::Bytes(data)) => string(data).map(|s| id = s),
            (2, Value::Bytes(data)) => string(data).map(|_| ()),
            (3 | 4, Value::Bytes(entry)) => strings_only(entry, &[1, 2]),
            _ => None,
        }),
        _ => None,
    })?;
    Some(id)
}

/// NodeGroupAutoscalingOptionsRequest: `id = 1`, and `defaults = 2` checked to parse.
pub fn options_group_id(buf: &[u8]) -> Option<&str> {
    let mut id = "";
    fields(buf, |number, value| match (number, value) {
        (1, Value::Bytes(data)) => string(data).map(|s| id = s),
        (2, Value::Bytes(defaults)) => fields(defaults, |number, value| match (number, value) {
            (1 | 2, Value::Fixed) | (6 | 7 | 12, Value::Varint) => Some(()),
            (3..=5, Value::Bytes(duration)) => varints_only(duration, &[1]),
            (8..=11, Value::Bytes(duration)) => varints_only(duration, &[1, 2]),
            _ => None,
        }),
        _ => None,
    })?;
    Some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_id_and_refuses_what_may_not_parse() {
        assert_eq!(group_id(b"\x0a\x07workers"), Some("workers"));
        assert_eq!(group_id(b""), Some(""));
        assert_eq!(group_id(b"\x0a\x02\xff\xfe"), None); // not UTF-8
        assert_eq!(group_id(b"\x0a\x05ab"), None); // truncated
        assert_eq!(group_id(b"\x10\x01"), None); // unknown field
        assert_eq!(empty(b""), Some(()));
        assert_eq!(empty(b"\x08\x01"), None);
    }

    #[test]
    fn provider_id_inside_the_node() {
        let node = b"\x0a\x0fcloudscale://ab\x12\x01n\x1a\x06\x0a\x01k\x12\x01v";
        let mut request = vec![0x0a, node.len() as u8];
        request.extend_from_slice(node);
        assert_eq!(provider_id(&request), Some("cloudscale://ab"));
        assert_eq!(provider_id(b"\x0a\x03\x1a\x01\x08"), None); // a map entry with a varint
    }

    #[test]
    fn options_defaults_are_checked() {
        // id "w", defaults { scaleDownUtilizationThreshold: fixed64, 8: {seconds: 1} }
        let request = b"\x0a\x01w\x12\x0d\x09\0\0\0\0\0\0\xe0\x3f\x42\x02\x08\x01";
        assert_eq!(options_group_id(request), Some("w"));
        assert_eq!(options_group_id(b"\x0a\x01w\x12\x02\x42\x05"), None);
    }
}
