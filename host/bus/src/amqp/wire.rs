//! AMQP 0-9-1 framing and field encoding: just what a publisher (and the
//! tests' consumer) needs. Numbers are big-endian; see the AMQP 0-9-1
//! specification, sections 4.2 (framing) and 4.2.5 (field types, with
//! RabbitMQ's table types).

pub(crate) const PROTOCOL_HEADER: &[u8; 8] = b"AMQP\x00\x00\x09\x01";
pub(crate) const FRAME_METHOD: u8 = 1;
pub(crate) const FRAME_HEADER: u8 = 2;
pub(crate) const FRAME_BODY: u8 = 3;
pub(crate) const FRAME_HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xCE;
/// Frame overhead: type, channel, size, frame-end.
pub(crate) const FRAME_OVERHEAD: usize = 8;

pub(crate) mod method {
    pub const CONNECTION_START: (u16, u16) = (10, 10);
    pub const CONNECTION_START_OK: (u16, u16) = (10, 11);
    pub const CONNECTION_SECURE: (u16, u16) = (10, 20);
    pub const CONNECTION_TUNE: (u16, u16) = (10, 30);
    pub const CONNECTION_TUNE_OK: (u16, u16) = (10, 31);
    pub const CONNECTION_OPEN: (u16, u16) = (10, 40);
    pub const CONNECTION_OPEN_OK: (u16, u16) = (10, 41);
    pub const CONNECTION_CLOSE: (u16, u16) = (10, 50);
    pub const CONNECTION_CLOSE_OK: (u16, u16) = (10, 51);
    pub const CONNECTION_BLOCKED: (u16, u16) = (10, 60);
    pub const CONNECTION_UNBLOCKED: (u16, u16) = (10, 61);
    pub const CHANNEL_OPEN: (u16, u16) = (20, 10);
    pub const CHANNEL_OPEN_OK: (u16, u16) = (20, 11);
    pub const CHANNEL_FLOW: (u16, u16) = (20, 20);
    pub const CHANNEL_FLOW_OK: (u16, u16) = (20, 21);
    pub const CHANNEL_CLOSE: (u16, u16) = (20, 40);
    pub const CHANNEL_CLOSE_OK: (u16, u16) = (20, 41);
    pub const EXCHANGE_DECLARE: (u16, u16) = (40, 10);
    pub const EXCHANGE_DECLARE_OK: (u16, u16) = (40, 11);
    pub const EXCHANGE_DELETE: (u16, u16) = (40, 20);
    pub const EXCHANGE_DELETE_OK: (u16, u16) = (40, 21);
    pub const QUEUE_DECLARE: (u16, u16) = (50, 10);
    pub const QUEUE_DECLARE_OK: (u16, u16) = (50, 11);
    pub const QUEUE_BIND: (u16, u16) = (50, 20);
    pub const QUEUE_BIND_OK: (u16, u16) = (50, 21);
    pub const BASIC_PUBLISH: (u16, u16) = (60, 40);
    pub const BASIC_RETURN: (u16, u16) = (60, 50);
    pub const BASIC_GET: (u16, u16) = (60, 70);
    pub const BASIC_GET_OK: (u16, u16) = (60, 71);
    pub const BASIC_GET_EMPTY: (u16, u16) = (60, 72);
    pub const BASIC_ACK: (u16, u16) = (60, 80);
    pub const BASIC_NACK: (u16, u16) = (60, 120);
    pub const CONFIRM_SELECT: (u16, u16) = (85, 10);
    pub const CONFIRM_SELECT_OK: (u16, u16) = (85, 11);
}

/// The basic class's id, in content headers.
pub(crate) const CLASS_BASIC: u16 = 60;

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub kind: u8,
    pub channel: u16,
    pub payload: Vec<u8>,
}

impl Frame {
    /// The (class, method) ids and the arguments of a method frame.
    pub(crate) fn method(&self) -> Option<((u16, u16), &[u8])> {
        if self.kind != FRAME_METHOD || self.payload.len() < 4 {
            return None;
        }
        let p = &self.payload;
        let id = (
            u16::from_be_bytes([p[0], p[1]]),
            u16::from_be_bytes([p[2], p[3]]),
        );
        Some((id, &p[4..]))
    }
}

/// Takes one frame off the front of `buf`, if it is complete.
pub(crate) fn take_frame(buf: &mut Vec<u8>, max_size: usize) -> Result<Option<Frame>, String> {
    if buf.len() >= 4 && &buf[..4] == b"AMQP" {
        return Err(format!(
            "the server does not speak AMQP 0-9-1 (it answered with protocol header {:?})",
            &buf[..buf.len().min(8)]
        ));
    }
    if buf.len() < 7 {
        return Ok(None);
    }
    let size = u32::from_be_bytes([buf[3], buf[4], buf[5], buf[6]]) as usize;
    if size > max_size {
        return Err(format!(
            "frame of {size} bytes exceeds the limit of {max_size}"
        ));
    }
    if buf.len() < 7 + size + 1 {
        return Ok(None);
    }
    if buf[7 + size] != FRAME_END {
        return Err("malformed frame (no frame-end octet)".into());
    }
    let frame = Frame {
        kind: buf[0],
        channel: u16::from_be_bytes([buf[1], buf[2]]),
        payload: buf[7..7 + size].to_vec(),
    };
    buf.drain(..7 + size + 1);
    Ok(Some(frame))
}

/// Appends one frame to `out`.
pub(crate) fn put_frame(out: &mut Vec<u8>, kind: u8, channel: u16, payload: &[u8]) {
    out.push(kind);
    out.extend_from_slice(&channel.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.push(FRAME_END);
}

/// A string longer than a short string (255 bytes) can hold.
#[derive(Debug)]
pub(crate) struct TooLong;

/// Builds a method's arguments (or a content header).
pub(crate) struct Enc(pub Vec<u8>);

/// A value in a field table (the types this crate writes).
pub(crate) enum Field<'a> {
    Str(&'a str),
    Bool(bool),
    Table(Vec<(&'a str, Field<'a>)>),
}

impl Enc {
    pub(crate) fn method(id: (u16, u16)) -> Enc {
        let mut e = Enc(Vec::with_capacity(64));
        e.u16(id.0).u16(id.1);
        e
    }
    pub(crate) fn u8(&mut self, v: u8) -> &mut Enc {
        self.0.push(v);
        self
    }
    pub(crate) fn u16(&mut self, v: u16) -> &mut Enc {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Enc {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Enc {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn shortstr(&mut self, s: &str) -> Result<&mut Enc, TooLong> {
        let len = u8::try_from(s.len()).map_err(|_| TooLong)?;
        self.0.push(len);
        self.0.extend_from_slice(s.as_bytes());
        Ok(self)
    }
    pub(crate) fn longstr(&mut self, s: &[u8]) -> &mut Enc {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s);
        self
    }
    pub(crate) fn table(&mut self, entries: &[(&str, Field<'_>)]) -> Result<&mut Enc, TooLong> {
        let at = self.0.len();
        self.u32(0);
        for (name, value) in entries {
            self.shortstr(name)?;
            match value {
                Field::Str(s) => {
                    self.u8(b'S').longstr(s.as_bytes());
                }
                Field::Bool(b) => {
                    self.u8(b't').u8(u8::from(*b));
                }
                Field::Table(t) => {
                    self.u8(b'F').table(t)?;
                }
            }
        }
        let len = (self.0.len() - at - 4) as u32;
        self.0[at..at + 4].copy_from_slice(&len.to_be_bytes());
        Ok(self)
    }
}

/// A decoded field-table value.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    Str(String),
    Bytes(Vec<u8>),
    Bool(bool),
    Int(i64),
    Float(f64),
    Decimal { scale: u8, value: u32 },
    Timestamp(u64),
    Table(Vec<(String, FieldValue)>),
    Array(Vec<FieldValue>),
    Void,
}

/// Reads a method's arguments (or a content header).
pub(crate) struct Dec<'a> {
    buf: &'a [u8],
}

/// Input ended before what it announced.
#[derive(Debug)]
pub(crate) struct Truncated;

impl<'a> Dec<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Dec<'a> {
        Dec { buf }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        if self.buf.len() < n {
            return Err(Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, Truncated> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, Truncated> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().unwrap()))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, Truncated> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, Truncated> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub(crate) fn shortstr(&mut self) -> Result<String, Truncated> {
        let n = self.u8()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    pub(crate) fn longstr(&mut self) -> Result<&'a [u8], Truncated> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub(crate) fn table(&mut self) -> Result<Vec<(String, FieldValue)>, Truncated> {
        let mut inner = Dec::new(self.longstr()?);
        let mut out = Vec::new();
        while !inner.buf.is_empty() {
            let name = inner.shortstr()?;
            let value = inner.value()?;
            out.push((name, value));
        }
        Ok(out)
    }
    fn value(&mut self) -> Result<FieldValue, Truncated> {
        Ok(match self.u8()? {
            b't' => FieldValue::Bool(self.u8()? != 0),
            b'b' => FieldValue::Int(self.u8()? as i8 as i64),
            b'B' => FieldValue::Int(self.u8()? as i64),
            b's' => FieldValue::Int(self.u16()? as i16 as i64),
            b'u' => FieldValue::Int(self.u16()? as i64),
            b'I' => FieldValue::Int(self.u32()? as i32 as i64),
            b'i' => FieldValue::Int(self.u32()? as i64),
            b'l' | b'L' => FieldValue::Int(self.u64()? as i64),
            b'f' => FieldValue::Float(f32::from_bits(self.u32()?) as f64),
            b'd' => FieldValue::Float(f64::from_bits(self.u64()?)),
            b'D' => FieldValue::Decimal {
                scale: self.u8()?,
                value: self.u32()?,
            },
            b'S' => {
                let b = self.longstr()?;
                match std::str::from_utf8(b) {
                    Ok(s) => FieldValue::Str(s.to_string()),
                    Err(_) => FieldValue::Bytes(b.to_vec()),
                }
            }
            b'x' => FieldValue::Bytes(self.longstr()?.to_vec()),
            b'T' => FieldValue::Timestamp(self.u64()?),
            b'F' => FieldValue::Table(self.table()?),
            b'A' => {
                let mut inner = Dec::new(self.longstr()?);
                let mut items = Vec::new();
                while !inner.buf.is_empty() {
                    items.push(inner.value()?);
                }
                FieldValue::Array(items)
            }
            b'V' => FieldValue::Void,
            _ => return Err(Truncated),
        })
    }
}

/// The content header of a basic message: class, weight, body size, then
/// the properties present.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Properties {
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    pub headers: Option<Vec<(String, FieldValue)>>,
    pub delivery_mode: Option<u8>,
}

/// Property flags, in the order of the property list.
const P_CONTENT_TYPE: u16 = 1 << 15;
const P_CONTENT_ENCODING: u16 = 1 << 14;
const P_HEADERS: u16 = 1 << 13;
const P_DELIVERY_MODE: u16 = 1 << 12;
const P_PRIORITY: u16 = 1 << 11;
const P_CORRELATION_ID: u16 = 1 << 10;
const P_REPLY_TO: u16 = 1 << 9;
const P_EXPIRATION: u16 = 1 << 8;
const P_MESSAGE_ID: u16 = 1 << 7;
const P_TIMESTAMP: u16 = 1 << 6;
const P_TYPE: u16 = 1 << 5;
const P_USER_ID: u16 = 1 << 4;
const P_APP_ID: u16 = 1 << 3;

/// Decodes a content header: the body size and the properties this crate
/// reads (the others are skipped).
pub(crate) fn decode_content_header(payload: &[u8]) -> Result<(u64, Properties), Truncated> {
    let mut d = Dec::new(payload);
    let _class = d.u16()?;
    let _weight = d.u16()?;
    let size = d.u64()?;
    let flags = d.u16()?;
    let mut p = Properties::default();
    if flags & P_CONTENT_TYPE != 0 {
        p.content_type = Some(d.shortstr()?);
    }
    if flags & P_CONTENT_ENCODING != 0 {
        p.content_encoding = Some(d.shortstr()?);
    }
    if flags & P_HEADERS != 0 {
        p.headers = Some(d.table()?);
    }
    if flags & P_DELIVERY_MODE != 0 {
        p.delivery_mode = Some(d.u8()?);
    }
    if flags & P_PRIORITY != 0 {
        d.u8()?;
    }
    for f in [P_CORRELATION_ID, P_REPLY_TO, P_EXPIRATION, P_MESSAGE_ID] {
        if flags & f != 0 {
            d.shortstr()?;
        }
    }
    if flags & P_TIMESTAMP != 0 {
        d.u64()?;
    }
    for f in [P_TYPE, P_USER_ID, P_APP_ID] {
        if flags & f != 0 {
            d.shortstr()?;
        }
    }
    Ok((size, p))
}

/// Encodes the content header of a persistent message with a content type
/// and string headers.
pub(crate) fn encode_content_header(
    body_size: u64,
    content_type: &str,
    headers: &[(&str, Field<'_>)],
) -> Result<Vec<u8>, TooLong> {
    let mut e = Enc(Vec::with_capacity(64));
    e.u16(CLASS_BASIC).u16(0).u64(body_size);
    e.u16(P_CONTENT_TYPE | P_HEADERS | P_DELIVERY_MODE);
    e.shortstr(content_type)?;
    e.table(headers)?;
    e.u8(2); // persistent
    Ok(e.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_wait_for_completeness() {
        let mut out = Vec::new();
        put_frame(&mut out, FRAME_METHOD, 1, b"\x00\x3c\x00\x28abc");
        put_frame(&mut out, FRAME_HEARTBEAT, 0, b"");
        let mut buf = out[..5].to_vec();
        assert_eq!(take_frame(&mut buf, 1000).unwrap(), None);
        buf = out.clone();
        let f = take_frame(&mut buf, 1000).unwrap().unwrap();
        assert_eq!(f.method().unwrap(), ((60, 40), &b"abc"[..]));
        assert_eq!(f.channel, 1);
        let f = take_frame(&mut buf, 1000).unwrap().unwrap();
        assert_eq!(f.kind, FRAME_HEARTBEAT);
        assert!(buf.is_empty());
        let mut big = Vec::new();
        put_frame(&mut big, FRAME_BODY, 1, &[0; 100]);
        assert!(take_frame(&mut big, 99).is_err());
        let mut proto = b"AMQP\x00\x00\x09\x01".to_vec();
        assert!(
            take_frame(&mut proto, 1000)
                .unwrap_err()
                .contains("AMQP 0-9-1")
        );
    }

    #[test]
    fn content_header_round_trip() {
        let h = encode_content_header(
            42,
            "application/json",
            &[("a", Field::Str("b")), ("t", Field::Bool(true))],
        )
        .unwrap();
        let (size, p) = decode_content_header(&h).unwrap();
        assert_eq!(size, 42);
        assert_eq!(p.content_type.as_deref(), Some("application/json"));
        assert_eq!(p.delivery_mode, Some(2));
        assert_eq!(
            p.headers.unwrap(),
            vec![
                ("a".to_string(), FieldValue::Str("b".into())),
                ("t".to_string(), FieldValue::Bool(true))
            ]
        );
        assert!(Enc(vec![]).shortstr(&"x".repeat(256)).is_err());
    }
}
