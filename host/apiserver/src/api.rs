//! The resource verbs: get, list, watch, create, replace, patch, delete and
//! deletecollection, on top of the store. Updates follow kube-apiserver's
//! "guaranteed update" loop: read the current object, compute the new one
//! outside the lock, commit only if the object is still at the version that
//! was read, else retry (or answer 409 when the client gave a version).
//! Mutating admission webhooks ([`crate::admission`]) are called between
//! computing the object and validating it, with no lock held.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use bytes::Bytes;
use serde_json::{Value, json};

use crate::Shared;
use crate::admission;
use crate::error::{ApiError, Cause};
use crate::objects;
use crate::patch::{self, PatchType};
use crate::resources::{RESOURCES, ResourceId, ResourceType};
use crate::selector::{FieldSelector, LabelSelector, Selectors};
use crate::store::{Key, StoreError, rv_of};
use crate::table::{self, TableRequest};
use crate::watch::{self, StartAt, WatchRequest};

/// A request's target: resource, namespace, optional name and subresource.
#[derive(Debug, Clone)]
pub struct Target {
    pub resource: ResourceId,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

impl Target {
    pub fn rt(&self) -> &'static ResourceType {
        &RESOURCES[self.resource]
    }

    fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or("")
    }

    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }

    fn is_status(&self) -> bool {
        self.subresource.as_deref() == Some("status")
    }
}

/// Query parameters, decoded.
pub type Query = HashMap<String, String>;

/// What a verb answers: a JSON document or a watch stream.
pub enum Reply {
    Json(u16, Value),
    /// A stored object, serialised without copying it.
    Stored(u16, Arc<Value>),
    /// A JSON document already serialised.
    Raw(u16, Bytes),
    Watch(watch::Chunks),
}

fn store_err(t: &Target, e: StoreError) -> ApiError {
    match e {
        StoreError::NotFound => ApiError::not_found(t.rt(), t.name()),
        StoreError::AlreadyExists => ApiError::already_exists(t.rt(), t.name()),
        StoreError::Changed => ApiError::conflict(t.rt(), t.name()),
        StoreError::NamespaceNotFound(ns) => {
            ApiError::not_found(&RESOURCES[crate::resources::namespaces_id()], &ns)
        }
        StoreError::NotServed => ApiError::path_not_found(),
        StoreError::NamespaceTerminating(ns) => ApiError {
            code: 403,
            reason: "Forbidden".into(),
            message: format!(
                "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                t.rt().qualified(),
                t.name()
            ),
            details: None,
            retry_after: None,
        },
    }
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s:?}")))
}

fn dry_run(q: &Query) -> bool {
    q.get("dryRun").is_some_and(|v| v == "All")
}

/// kube-apiserver's checks of list and watch options (422 Invalid
/// `ListOptions.meta.k8s.io`), for the parameters this server serves.
fn check_list_options(q: &Query, watch: bool) -> Result<(), ApiError> {
    let get = |k: &str| q.get(k).map(String::as_str).filter(|v| !v.is_empty());
    let (rv, rv_match, cont) = (
        get("resourceVersion"),
        get("resourceVersionMatch"),
        get("continue"),
    );
    let send_initial = q.get("sendInitialEvents");
    let forbidden = |field: &str, why: String| Cause {
        reason: "FieldValueForbidden",
        message: format!("Forbidden: {why}"),
        field: field.into(),
    };
    let not_supported = |m: &str, supported: &str| Cause {
        reason: "FieldValueNotSupported",
        message: format!("Unsupported value: \"{m}\": supported values: {supported}"),
        field: "resourceVersionMatch".into(),
    };
    let mut causes = Vec::new();
    if watch {
        if send_initial.is_some() && rv_match != Some("NotOlderThan") {
            causes.push(forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan".into(),
            ));
        }
        if let Some(m) = rv_match {
            if send_initial.is_none() {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided".into(),
                ));
            }
            if m != "NotOlderThan" {
                causes.push(not_supported(m, "\"NotOlderThan\""));
            }
            if cont.is_some() {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided".into(),
                ));
            }
        }
    } else {
        if let Some(m) = rv_match {
            if rv.is_none() {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided".into(),
                ));
            }
            if cont.is_some() {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided".into(),
                ));
            }
            if m != "Exact" && m != "NotOlderThan" {
                causes.push(not_supported(m, "\"Exact\", \"NotOlderThan\", \"\""));
            }
            if m == "Exact" && rv == Some("0") {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"".into(),
                ));
            }
        }
        if send_initial.is_some() {
            causes.push(forbidden(
                "sendInitialEvents",
                "sendInitialEvents is forbidden for list".into(),
            ));
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_kind(
            "meta.k8s.io",
            "ListOptions",
            "",
            causes,
        ))
    }
}

fn selectors(rt: &ResourceType, q: &Query, name: Option<&str>) -> Result<Selectors, ApiError> {
    let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))?;
    let mut field = q.get("fieldSelector").cloned().unwrap_or_default();
    if let Some(n) = name {
        if !field.is_empty() {
            field.push(',');
        }
        field.push_str(&format!("metadata.name={n}"));
    }
    let fields = FieldSelector::parse(&field, rt)?;
    Ok(Selectors { labels, fields })
}

/// Parse a request body by its media type, as kube-apiserver negotiates it:
/// `application/json` (also when there is no Content-Type), `application/yaml`
/// or `application/vnd.kubernetes.protobuf` (decoded by [`crate::protobuf`]);
/// any other media type, or a malformed one, is 415.
pub fn parse_body(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    let media = if content_type.is_empty() {
        Some("application/json".to_owned())
    } else {
        body_media_type(content_type)
    };
    let parse = match media.as_deref() {
        Some("application/json") => parse_json,
        Some("application/yaml") => parse_yaml,
        Some("application/vnd.kubernetes.protobuf") => crate::protobuf::decode,
        _ => return Err(ApiError::unsupported_media_type(content_type)),
    };
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    parse(body)
}

/// The media type of a Content-Type (lower case, parameters dropped), or None
/// when it is malformed (where Go's `mime.ParseMediaType` fails and
/// kube-apiserver answers 415).
fn body_media_type(content_type: &str) -> Option<String> {
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|c| c.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?=".contains(&c))
    };
    let mut parts = content_type.split(';');
    let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
    let (ty, sub) = media.split_once('/').unwrap_or((&media, ""));
    if !token(ty) || !(media.len() == ty.len() || token(sub)) {
        return None;
    }
    let mut seen = Vec::new();
    for param in parts.map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = param.split_once('=')?;
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        let quoted = v.len() >= 2 && v.starts_with('"') && v.ends_with('"');
        if !token(&k) || !(token(v) || quoted) || seen.contains(&k) {
            return None;
        }
        seen.push(k);
    }
    Some(media)
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let mut why = e.to_string();
        // serde_json stops at 128 levels; past Go's 10,000 say what
        // kube-apiserver says.
        if why.starts_with("recursion limit exceeded")
            && let Some(c) = json_past_max_depth(body)
        {
            why = format!("invalid character '{}' exceeded max depth", char::from(c));
        }
        ApiError::bad_request(format!(
            "couldn't get version/kind; json parse error: {why}"
        ))
    })
}

/// The bracket at which JSON nesting passes [`YAML_MAX_DEPTH`] (also Go's
/// `encoding/json` limit), if it does.
fn json_past_max_depth(body: &[u8]) -> Option<u8> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &c in body {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > YAML_MAX_DEPTH {
                    return Some(c);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

fn parse_yaml(body: &[u8]) -> Result<Value, ApiError> {
    if let Some(why) = yaml_too_deep(body) {
        return Err(ApiError::bad_request(format!("error decoding YAML: {why}")));
    }
    serde_yaml::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

/// go-yaml's limit on flow nesting and on block indentation levels
/// (kube-apiserver decodes YAML bodies with it).
const YAML_MAX_DEPTH: usize = 10_000;

/// `serde_yaml`'s recursion limit. Its parser (libyaml) needs time proportional
/// to the tokens times the flow depth (a 100,000-deep `{a: {a: ...}}` takes
/// minutes), so flow nesting deeper than serde_yaml accepts anyway is refused
/// before parsing.
const YAML_SERDE_DEPTH: usize = 128;

/// Why a YAML body nests too deep to be parsed, from one linear pass over it:
/// go-yaml's error past [`YAML_MAX_DEPTH`] (flow or block), else
/// `serde_yaml`'s for flow nesting past [`YAML_SERDE_DEPTH`].
fn yaml_too_deep(body: &[u8]) -> Option<String> {
    let mut scan = DepthScan {
        b: body,
        line: 1,
        line_start: 0,
        flow: 0,
        indents: Vec::new(),
        past_serde: None,
        past_limit: None,
    };
    scan.run();
    if let Some(line) = scan.past_limit {
        // go-yaml names the line unless it is the first.
        let at = if line > 1 {
            format!("line {line}: ")
        } else {
            String::new()
        };
        return Some(format!("yaml: {at}exceeded max depth of {YAML_MAX_DEPTH}"));
    }
    scan.past_serde
        .map(|(line, col)| format!("recursion limit exceeded at line {line} column {col}"))
}

/// How a line of block content ended.
enum LineEnd {
    Done,
    /// A `|` or `>` header, with its explicit indentation indicator if any.
    BlockScalar(Option<usize>),
    /// A plain scalar that may continue on more indented lines.
    Plain,
}

/// A tokenizer just precise enough to find where flow collections open and
/// close and where block collections start (libyaml's indentation stack,
/// `roll_indent`):
/// quoted scalars, comments, block scalars and multi-line plain scalars are
/// skipped as libyaml skips them, so brackets inside them do not count.
struct DepthScan<'a> {
    b: &'a [u8],
    line: usize,
    line_start: usize,
    flow: usize,
    /// Columns of the open block collections (strictly increasing).
    indents: Vec<usize>,
    /// Line and column of the first flow collection past `serde_yaml`'s limit.
    past_serde: Option<(usize, usize)>,
    /// Line where nesting first passes go-yaml's limit.
    past_limit: Option<usize>,
}

impl DepthScan<'_> {
    fn at(&self, i: usize) -> u8 {
        self.b.get(i).copied().unwrap_or(0)
    }

    fn blank_or_end(&self, i: usize) -> bool {
        matches!(self.at(i), 0 | b' ' | b'\t' | b'\r' | b'\n')
    }

    fn skip_blanks(&self, mut i: usize) -> usize {
        while matches!(self.at(i), b' ' | b'\t' | b'\r') {
            i += 1;
        }
        i
    }

    /// The start of the line after the one holding `i` (or the end).
    fn next_line(&mut self, i: usize) -> usize {
        match self
            .b
            .get(i..)
            .and_then(|r| r.iter().position(|&c| c == b'\n'))
        {
            Some(n) => {
                self.line += 1;
                self.line_start = i + n + 1;
                self.line_start
            }
            None => self.b.len(),
        }
    }

    /// A block collection starts at `i`.
    fn roll(&mut self, i: usize) {
        let col = i - self.line_start;
        if self.indents.last().is_none_or(|&top| col > top) {
            self.indents.push(col);
            if self.indents.len() > YAML_MAX_DEPTH {
                self.past_limit.get_or_insert(self.line);
            }
        }
    }

    fn open_flow(&mut self, i: usize) {
        self.flow += 1;
        if self.flow > YAML_SERDE_DEPTH && self.past_serde.is_none() {
            let chars = self.b[self.line_start..i]
                .iter()
                .filter(|&&c| c & 0xC0 != 0x80)
                .count();
            self.past_serde = Some((self.line, chars + 1));
        }
        if self.flow > YAML_MAX_DEPTH {
            self.past_limit.get_or_insert(self.line);
        }
    }

    /// Past the quoted scalar starting at `i`.
    fn skip_quoted(&mut self, i: usize) -> usize {
        let quote = self.b[i];
        let mut j = i + 1;
        while j < self.b.len() {
            match self.b[j] {
                b'\n' => {
                    j = self.next_line(j);
                }
                b'\\' if quote == b'"' => {
                    j = if self.at(j + 1) == b'\n' {
                        self.next_line(j + 1)
                    } else {
                        j + 2
                    };
                }
                c if c == quote => {
                    if quote == b'\'' && self.at(j + 1) == b'\'' {
                        j += 2;
                    } else {
                        return j + 1;
                    }
                }
                _ => j += 1,
            }
        }
        self.b.len()
    }

    /// Past the flow collection opening at `i` (possibly over several lines).
    fn flow(&mut self, mut i: usize) -> usize {
        // At a token boundary (where a quote starts a scalar and `#` a comment).
        let mut boundary = true;
        let mut after_blank = false;
        let mut after_quoted = false;
        while i < self.b.len() {
            let c = self.b[i];
            let (was_blank, was_quoted) = (after_blank, after_quoted);
            after_blank = false;
            after_quoted = false;
            match c {
                b'[' | b'{' => {
                    self.open_flow(i);
                    i += 1;
                    boundary = true;
                }
                b']' | b'}' => {
                    self.flow = self.flow.saturating_sub(1);
                    i += 1;
                    if self.flow == 0 {
                        return i;
                    }
                    boundary = true;
                }
                b',' => {
                    i += 1;
                    boundary = true;
                }
                b' ' | b'\t' | b'\r' | b'\n' => {
                    i = if c == b'\n' { self.next_line(i) } else { i + 1 };
                    after_blank = true;
                    after_quoted = was_quoted;
                }
                b'#' if boundary || was_blank => {
                    i = self.b[i..]
                        .iter()
                        .position(|&c| c == b'\n')
                        .map_or(self.b.len(), |n| i + n);
                }
                b'"' | b'\'' if boundary => {
                    i = self.skip_quoted(i);
                    boundary = false;
                    after_quoted = true;
                }
                b':' | b'?' if was_quoted || self.blank_or_end(i + 1) => {
                    i += 1;
                    boundary = true;
                }
                b'&' | b'!' if boundary => {
                    while !self.blank_or_end(i) && !b",[]{}".contains(&self.at(i)) {
                        i += 1;
                    }
                }
                _ => {
                    i += 1;
                    boundary = false;
                }
            }
        }
        i
    }

    /// `i` is past a scalar or flow collection: if a `:` follows on the line,
    /// the position after it.
    fn value_indicator(&self, i: usize) -> Option<usize> {
        let j = self.skip_blanks(i);
        (self.at(j) == b':' && self.blank_or_end(j + 1)).then_some(j + 1)
    }

    /// The block content of one line from `i`, a node position.
    fn node_line(&mut self, mut i: usize) -> (usize, LineEnd) {
        loop {
            i = self.skip_blanks(i);
            match self.at(i) {
                0 | b'\n' | b'#' => return (self.next_line(i), LineEnd::Done),
                b'-' | b'?' if self.blank_or_end(i + 1) => {
                    self.roll(i);
                    i += 1;
                }
                b':' if self.blank_or_end(i + 1) => i += 1,
                b'[' | b'{' => {
                    let (start, line) = (i, self.line);
                    i = self.flow(i);
                    match self.value_indicator(i) {
                        Some(j) => {
                            // A flow collection as a key.
                            if self.line == line {
                                self.roll(start);
                            }
                            i = j;
                        }
                        None => return (self.next_line(i), LineEnd::Done),
                    }
                }
                b'|' | b'>' => {
                    let header = self.b[i + 1..]
                        .iter()
                        .take_while(|c| c.is_ascii_digit() || matches!(c, b'+' | b'-'));
                    let explicit = header
                        .filter(|c| c.is_ascii_digit())
                        .map(|c| usize::from(c - b'0'))
                        .next();
                    return (self.next_line(i), LineEnd::BlockScalar(explicit));
                }
                b'&' | b'!' => {
                    while !self.blank_or_end(i) {
                        i += 1;
                    }
                }
                c @ (b'"' | b'\'' | b'*') => {
                    let (start, line) = (i, self.line);
                    if c == b'*' {
                        while !self.blank_or_end(i) {
                            i += 1;
                        }
                    } else {
                        i = self.skip_quoted(i);
                    }
                    match self.value_indicator(i) {
                        Some(j) => {
                            if self.line == line {
                                self.roll(start);
                            }
                            i = j;
                        }
                        None => return (self.next_line(i), LineEnd::Done),
                    }
                }
                _ => {
                    // A plain scalar: a key if `: ` follows on the line.
                    let start = i;
                    loop {
                        match self.at(i) {
                            0 | b'\n' => return (self.next_line(i), LineEnd::Plain),
                            b':' if self.blank_or_end(i + 1) => {
                                self.roll(start);
                                i += 1;
                                break;
                            }
                            b'#' if matches!(self.at(i - 1), b' ' | b'\t') => {
                                return (self.next_line(i), LineEnd::Done);
                            }
                            _ => i += 1,
                        }
                    }
                }
            }
        }
    }

    fn run(&mut self) {
        let mut i = if self.b.starts_with(b"\xEF\xBB\xBF") {
            3
        } else {
            0
        };
        self.line_start = i;
        // A block scalar being skipped: the indentation of its parent (None:
        // top level) and of its content once known.
        let mut block_scalar: Option<(Option<usize>, Option<usize>)> = None;
        let mut plain = false;
        while i < self.b.len() && self.past_limit.is_none() {
            let indent = self.b[i..].iter().take_while(|&&c| c == b' ').count();
            let p = i + indent;
            let q = self.skip_blanks(p);
            if matches!(self.at(q), 0 | b'\n') {
                i = self.next_line(q);
                continue;
            }
            let marker = indent == 0
                && (self.b[p..].starts_with(b"---") || self.b[p..].starts_with(b"..."))
                && self.blank_or_end(p + 3);
            if let Some((parent, content)) = block_scalar {
                let inside = !marker
                    && match content {
                        Some(c) => indent >= c,
                        None => parent.is_none_or(|p| indent > p),
                    };
                if inside {
                    block_scalar = Some((parent, Some(content.unwrap_or(indent))));
                    i = self.next_line(p);
                    continue;
                }
                block_scalar = None;
            }
            if plain {
                plain = false;
                let deeper = self.indents.last().is_none_or(|&top| indent > top);
                if !marker && self.at(q) != b'#' && deeper {
                    plain = true;
                    i = self.next_line(p);
                    continue;
                }
            }
            if self.at(q) == b'#' || (indent == 0 && self.at(p) == b'%') {
                i = self.next_line(q);
                continue;
            }
            while self.indents.last().is_some_and(|&t| t > indent) {
                self.indents.pop();
            }
            let mut start = p;
            if marker {
                self.indents.clear();
                if self.at(p) == b'.' {
                    i = self.next_line(p);
                    continue;
                }
                start = p + 3;
            }
            let (next, end) = self.node_line(start);
            i = next;
            match end {
                LineEnd::Done => {}
                LineEnd::Plain => plain = true,
                LineEnd::BlockScalar(explicit) => {
                    let parent = self.indents.last().copied();
                    let content = explicit.map(|n| parent.map_or(n, |p| p + n));
                    block_scalar = Some((parent, content));
                }
            }
        }
    }
}

pub fn get(sh: &Shared, t: &Target, table: Option<TableRequest>) -> Result<Reply, ApiError> {
    match sh.store.get(t.resource, t.ns(), t.name()) {
        Some(o) => Ok(match table {
            None => Reply::Stored(200, o),
            Some(req) => Reply::Json(200, table::object(t.rt(), &o, req, true)),
        }),
        None => Err(ApiError::not_found(t.rt(), t.name())),
    }
}

/// The object a write is about to change: 404 if it is missing, or the
/// injected 409 if a conflict was forced on it.
fn current_for_write(sh: &Shared, t: &Target) -> Result<std::sync::Arc<Value>, ApiError> {
    let rt = t.rt();
    let cur = sh
        .store
        .get(t.resource, t.ns(), t.name())
        .ok_or_else(|| ApiError::not_found(rt, t.name()))?;
    if sh.faults.take_conflict(rt.plural, t.ns(), t.name()) {
        return Err(ApiError::conflict(rt, t.name()));
    }
    Ok(cur)
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    v: String,
    rv: u64,
    start: (String, String),
}

fn encode_continue(rv: u64, start: &Key) -> String {
    let tok = ContinueToken {
        v: "meta.k8s.io/v1".into(),
        rv,
        start: start.clone(),
    };
    B64.encode(serde_json::to_vec(&tok).expect("serialisable"))
}

fn decode_continue(s: &str) -> Result<ContinueToken, ApiError> {
    B64.decode(s)
        .ok()
        .and_then(|b| serde_json::from_slice::<ContinueToken>(&b).ok())
        .ok_or_else(|| ApiError::bad_request("continue key is not valid: invalid token"))
}

pub fn list(
    sh: &Shared,
    t: &Target,
    q: &Query,
    table: Option<TableRequest>,
) -> Result<Reply, ApiError> {
    let rt = t.rt();
    check_list_options(q, false)?;
    let sel = selectors(rt, q, None)?;
    let rv_param = q.get("resourceVersion").map(String::as_str).unwrap_or("");
    let rv_match = q
        .get("resourceVersionMatch")
        .map(String::as_str)
        .unwrap_or("");
    let limit: usize = match q.get("limit").map(String::as_str) {
        None | Some("") => 0,
        Some(l) => l
            .parse::<i64>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?
            .max(0) as usize,
    };
    let mut start_after: Option<Key> = None;
    let mut at: Option<u64> = None;
    let mut not_older_than: Option<u64> = None;
    if let Some(c) = q.get("continue").filter(|c| !c.is_empty()) {
        if !rv_param.is_empty() && rv_param != "0" {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        let tok = decode_continue(c)?;
        at = Some(tok.rv);
        start_after = Some(tok.start);
    } else {
        // `check_list_options` refused every other combination.
        match (rv_param, rv_match) {
            ("", _) => {}
            (v, "Exact") => at = Some(parse_rv(v)?),
            (v, _) => not_older_than = Some(parse_rv(v)?),
        }
    }
    let ns = t.namespace.as_deref();
    let filtered = !sel.labels.is_empty() || !sel.fields.is_empty();
    let keep = |o: &serde_json::Value| !filtered || sel.matches(o);
    let page = match sh
        .store
        .list_page(t.resource, ns, at, start_after.as_ref(), &keep, limit)
    {
        Err(e) if e.code == 410 && start_after.is_some() => {
            return Err(ApiError::continue_expired());
        }
        r => r?,
    };
    let rv = page.rv;
    if let Some(n) = not_older_than
        && n > rv
    {
        return Err(ApiError::too_large_rv(n, rv));
    }
    let mut meta = json!({ "resourceVersion": rv.to_string() });
    if page.remaining > 0 {
        let last = &page.items.last().expect("limit > 0").0;
        meta["continue"] = json!(encode_continue(rv, last));
        if !filtered {
            meta["remainingItemCount"] = json!(page.remaining);
        }
    }
    let page = page.items;
    if let Some(req) = table {
        let items = page.iter().map(|(_, o)| o.as_ref());
        return Ok(Reply::Json(200, table::list(rt, items, meta, req)));
    }
    // Serialise by hand to avoid deep-cloning every item.
    let mut buf = Vec::with_capacity(128 + page.len() * 512);
    buf.extend_from_slice(b"{\"kind\":");
    serde_json::to_writer(&mut buf, &format!("{}List", rt.kind)).expect("string");
    buf.extend_from_slice(b",\"apiVersion\":");
    serde_json::to_writer(&mut buf, &rt.api_version()).expect("string");
    buf.extend_from_slice(b",\"metadata\":");
    serde_json::to_writer(&mut buf, &meta).expect("value");
    buf.extend_from_slice(b",\"items\":[");
    for (i, (_, o)) in page.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        serde_json::to_writer(&mut buf, o.as_ref()).expect("value");
    }
    buf.extend_from_slice(b"]}");
    Ok(Reply::Raw(200, Bytes::from(buf)))
}

pub fn watch(
    sh: &Shared,
    t: &Target,
    q: &Query,
    table: Option<TableRequest>,
) -> Result<Reply, ApiError> {
    let rt = t.rt();
    check_list_options(q, true)?;
    let sel = selectors(rt, q, t.name.as_deref())?;
    let flag = |k: &str| q.get(k).is_some_and(|v| v == "true" || v == "1");
    let rv_param = q.get("resourceVersion").map(String::as_str).unwrap_or("");
    let send_initial = q.get("sendInitialEvents").map(String::as_str);
    let start = match (send_initial, rv_param) {
        (Some("true"), _) => StartAt::Current,
        (Some("false"), "" | "0") => StartAt::CurrentNoInitial,
        (_, "" | "0") => StartAt::Current,
        (_, v) => StartAt::After(parse_rv(v)?),
    };
    let timeout = match q.get("timeoutSeconds").map(String::as_str) {
        None | Some("") => None,
        Some(s) => Some(Duration::from_secs(s.parse().map_err(|_| {
            ApiError::bad_request(format!("invalid timeoutSeconds {s:?}"))
        })?)),
    };
    let req = WatchRequest {
        resource: t.resource,
        namespace: t.namespace.clone(),
        selectors: sel,
        start,
        bookmarks: flag("allowWatchBookmarks"),
        initial_events_end: send_initial == Some("true"),
        timeout,
        table,
    };
    let from = match start {
        StartAt::After(n) => Some(n),
        _ => None,
    };
    let close = sh.faults.watch_close_rx();
    match sh.store.watch(t.resource, from) {
        Ok(mut ws) => {
            if start == StartAt::CurrentNoInitial {
                ws.initial.clear();
            }
            Ok(Reply::Watch(watch::stream(
                req,
                ws,
                sh.config.bookmark_interval,
                close,
            )))
        }
        // Its CRD went since the request was routed.
        Err(e) if e.code == 404 => Err(e),
        Err(e) => Ok(Reply::Watch(watch::error_stream(&e))),
    }
}

pub async fn create(sh: &Shared, t: &Target, q: &Query, body: Value) -> Result<Reply, ApiError> {
    let rt = t.rt();
    if rt.namespaced && t.namespace.is_none() {
        return Err(ApiError::method_not_allowed());
    }
    let client_named = body
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let (name, mut obj) = objects::prepare_create_unvalidated(rt, t.ns(), body)?;
    let t = Target {
        name: Some(name.clone()),
        ..t.clone()
    };
    if admission::configured(sh) {
        // kube's NamespaceLifecycle admits before the webhooks are called.
        namespace_admits_creation(sh, &t)?;
        let attr = admission::Attributes {
            operation: admission::Operation::Create,
            rt,
            subresource: None,
            namespace: t.ns(),
            name: if client_named { &name } else { "" },
            dry_run: dry_run(q),
            options_kind: "CreateOptions",
            field_manager: q.get("fieldManager").map(String::as_str),
        };
        let view = create_view(&obj, client_named);
        if let Some(mutated) = admission::admit(sh, &attr, &view, None).await? {
            obj = objects::after_create_admission(rt, t.ns(), &obj, mutated)?;
        }
    }
    objects::validate(rt, &name, &obj, Vec::new())?;
    if dry_run(q) {
        if sh.store.get(t.resource, t.ns(), &name).is_some() {
            return Err(ApiError::already_exists(rt, &name));
        }
        return Ok(Reply::Json(201, obj));
    }
    let stored = sh
        .store
        .create(t.resource, t.ns(), &name, obj)
        .map_err(|e| store_err(&t, e))?;
    Ok(Reply::Stored(201, stored))
}

/// A create in a namespace that does not exist (404) or is being deleted
/// (403) is refused before admission webhooks are called, as kube's
/// NamespaceLifecycle plugin refuses it.
fn namespace_admits_creation(sh: &Shared, t: &Target) -> Result<(), ApiError> {
    if !t.rt().namespaced {
        return Ok(());
    }
    match sh.store.get(crate::resources::namespaces_id(), "", t.ns()) {
        None if !sh.config.auto_create_namespaces => Err(store_err(
            t,
            StoreError::NamespaceNotFound(t.ns().to_string()),
        )),
        Some(ns) if ns.pointer("/metadata/deletionTimestamp").is_some() => Err(store_err(
            t,
            StoreError::NamespaceTerminating(t.ns().to_string()),
        )),
        _ => Ok(()),
    }
}

/// The object a webhook sees on CREATE: as kube-apiserver admits it before
/// storage sets uid, creationTimestamp and generation (and the name, for a
/// `generateName`).
fn create_view(obj: &Value, client_named: bool) -> Value {
    let mut view = obj.clone();
    if let Some(meta) = view.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in ["uid", "creationTimestamp", "generation"] {
            meta.remove(k);
        }
        if !client_named {
            meta.remove("name");
        }
    }
    view
}

/// The object a webhook sees on UPDATE: the prepared one, with the
/// generation it had (kube bumps it after admission).
fn update_view(new: &Value, cur: &Value) -> Value {
    let mut view = new.clone();
    if let Some(meta) = view.get_mut("metadata").and_then(Value::as_object_mut) {
        match cur.pointer("/metadata/generation") {
            Some(g) => meta.insert("generation".into(), g.clone()),
            None => meta.remove("generation"),
        };
    }
    view
}

/// How a write through [`update_with`] is presented to admission webhooks.
#[derive(Clone, Copy)]
struct Admission {
    /// `UpdateOptions` (PUT) or `PatchOptions` (PATCH).
    options_kind: &'static str,
    /// Through `/scale`: webhooks see (and patch) an autoscaling/v1 Scale.
    scale: bool,
}

/// The shared update loop behind PUT and PATCH: compute the object, let
/// the admission webhooks see it (no lock held), validate, then commit only
/// if the object is still at the version read, else compute again.
async fn update_with(
    sh: &Shared,
    t: &Target,
    q: &Query,
    mut compute: impl FnMut(&Value) -> Result<Value, ApiError>,
    client_rv: bool,
    adm: Admission,
) -> Result<Reply, ApiError> {
    let rt = t.rt();
    loop {
        let cur = current_for_write(sh, t)?;
        let cur_rv = rv_of(&cur);
        let desired = compute(&cur)?;
        let prepare = |desired: Value| -> Result<Value, ApiError> {
            let mut new = if t.is_status() {
                objects::prepare_status_update(rt, &cur, &desired)?
            } else {
                objects::prepare_update_unvalidated(rt, t.ns(), t.name(), &cur, desired)?
            };
            new["metadata"]["resourceVersion"] = json!(cur_rv.to_string());
            Ok(new)
        };
        let mut new = prepare(desired)?;
        if admission::configured(sh) {
            let subresource = if adm.scale {
                Some("scale")
            } else {
                t.subresource.as_deref()
            };
            let attr = admission::Attributes {
                operation: admission::Operation::Update,
                rt,
                subresource,
                namespace: if rt.is_namespace() { t.name() } else { t.ns() },
                name: t.name(),
                dry_run: dry_run(q),
                options_kind: adm.options_kind,
                field_manager: q.get("fieldManager").map(String::as_str),
            };
            let (view, old) = if adm.scale {
                (scale_of(&new), scale_of(&cur))
            } else {
                (update_view(&new, &cur), (*cur).clone())
            };
            if let Some(mutated) = admission::admit(sh, &attr, &view, Some(&old)).await? {
                let desired = if adm.scale {
                    let mut d = new.clone();
                    d["spec"]["replicas"] = json!(scale_replicas(&mutated, t.name())?);
                    d
                } else {
                    mutated
                };
                new = prepare(desired)?;
            }
        }
        if !t.is_status() {
            objects::validate_update_result(rt, t.name(), &cur, &new)?;
        }
        if new == *cur || dry_run(q) {
            return Ok(Reply::Json(200, new));
        }
        match sh.store.update(t.resource, t.ns(), t.name(), cur_rv, new) {
            Ok(o) => return Ok(Reply::Stored(200, o)),
            Err(StoreError::Changed) if !client_rv => continue,
            Err(e) => return Err(store_err(t, e)),
        }
    }
}

pub async fn replace(sh: &Shared, t: &Target, q: &Query, body: Value) -> Result<Reply, ApiError> {
    let rt = t.rt();
    if sh
        .faults
        .take_replace_failure(rt.plural, t.ns(), t.name(), &body)
    {
        return Err(ApiError::internal("injected fault"));
    }
    let wanted = body
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(parse_rv)
        .transpose()?;
    // Kinds whose strategy allows create-on-update (Lease, Service, Event):
    // a PUT of a missing name creates it, whatever version it carries.
    if rt.allows_create_on_update() && !t.is_status() {
        while sh.store.get(t.resource, t.ns(), t.name()).is_none() {
            let mut body = body.clone();
            if let Some(name) = body.pointer("/metadata/name").and_then(Value::as_str)
                && name != t.name()
            {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({name}) does not match the name on the URL ({})",
                    t.name()
                )));
            }
            if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("resourceVersion");
                meta.insert("name".into(), json!(t.name()));
            } else if body.is_object() {
                body["metadata"] = json!({ "name": t.name() });
            }
            match create(sh, t, q, body).await {
                Err(e) if e.code == 409 => continue,
                r => return r,
            }
        }
    }
    if wanted.is_none() && !rt.allows_unconditional_update() {
        return Err(ApiError::invalid(
            rt,
            t.name(),
            vec![Cause {
                reason: "FieldValueInvalid",
                message: "Invalid value: 0x0: must be specified for an update".into(),
                field: "metadata.resourceVersion".into(),
            }],
        ));
    }
    update_with(
        sh,
        t,
        q,
        |cur| {
            if wanted.is_some_and(|w| w != rv_of(cur)) {
                return Err(ApiError::conflict(rt, t.name()));
            }
            Ok(body.clone())
        },
        wanted.is_some(),
        Admission {
            options_kind: "UpdateOptions",
            scale: false,
        },
    )
    .await
}

pub async fn patch(
    sh: &Shared,
    t: &Target,
    q: &Query,
    ty: PatchType,
    body: Value,
) -> Result<Reply, ApiError> {
    let rt = t.rt();
    update_with(
        sh,
        t,
        q,
        |cur| {
            let patched = patch::apply(ty, cur, &body)?;
            match patched
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
            {
                Some(v) if !v.is_empty() && parse_rv(v)? != rv_of(cur) => {
                    Err(ApiError::conflict(rt, t.name()))
                }
                _ => Ok(patched),
            }
        },
        false,
        Admission {
            options_kind: "PatchOptions",
            scale: false,
        },
    )
    .await
}

/// A label selector as the string form `Scale.status.selector` carries.
fn selector_string(sel: Option<&Value>) -> String {
    let mut parts = Vec::new();
    let Some(sel) = sel else {
        return String::new();
    };
    if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            parts.push(format!("{k}={}", v.as_str().unwrap_or_default()));
        }
    }
    for e in sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        parts.push(match e.get("operator").and_then(Value::as_str) {
            Some("In") => format!("{key} in ({})", values.join(",")),
            Some("NotIn") => format!("{key} notin ({})", values.join(",")),
            Some("DoesNotExist") => format!("!{key}"),
            _ => key.to_string(),
        });
    }
    parts.join(",")
}

/// The `autoscaling/v1` Scale of a workload (its `/scale` subresource).
fn scale_of(obj: &Value) -> Value {
    let meta = |k: &str| obj.pointer(&format!("/metadata/{k}")).cloned();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta("name"),
            "namespace": meta("namespace"),
            "uid": meta("uid"),
            "resourceVersion": meta("resourceVersion"),
            "creationTimestamp": meta("creationTimestamp"),
        },
        "spec": { "replicas": obj.pointer("/spec/replicas").cloned().unwrap_or(json!(0)) },
        "status": {
            "replicas": obj.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
            "selector": selector_string(obj.pointer("/spec/selector")),
        },
    })
}

/// A Scale's `spec.replicas` (absent: 0); negative is 422 as kube answers.
fn scale_replicas(scale: &Value, name: &str) -> Result<i64, ApiError> {
    let replicas = scale
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if replicas < 0 {
        return Err(ApiError::invalid_kind(
            "autoscaling",
            "Scale",
            name,
            vec![Cause {
                reason: "FieldValueInvalid",
                message: format!("Invalid value: {replicas}: must be greater than or equal to 0"),
                field: "spec.replicas".into(),
            }],
        ));
    }
    Ok(replicas)
}

/// GET of `/scale`.
pub fn scale_get(sh: &Shared, t: &Target) -> Result<Reply, ApiError> {
    match sh.store.get(t.resource, t.ns(), t.name()) {
        Some(o) => Ok(Reply::Json(200, scale_of(&o))),
        None => Err(ApiError::not_found(t.rt(), t.name())),
    }
}

/// PUT (`patch` None) or PATCH of `/scale`: only `spec.replicas` reaches the
/// workload; a resourceVersion in the Scale is a precondition.
pub async fn scale_update(
    sh: &Shared,
    t: &Target,
    q: &Query,
    body: Value,
    patch: Option<PatchType>,
) -> Result<Reply, ApiError> {
    let rt = t.rt();
    let main = Target {
        subresource: None,
        ..t.clone()
    };
    let client_rv = patch.is_none()
        && body
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty());
    let reply = update_with(
        sh,
        &main,
        q,
        |cur| {
            let scale = scale_of(cur);
            let desired = match patch {
                Some(ty) => patch::apply(ty, &scale, &body)?,
                None => body.clone(),
            };
            serde_path_to_error::deserialize::<_, k8s_openapi::api::autoscaling::v1::Scale>(
                &desired,
            )
            .map_err(|e| {
                ApiError::bad_request(format!(
                    "Scale in version \"v1\" cannot be handled as a Scale: {}: {}",
                    e.path(),
                    e.inner()
                ))
            })?;
            if let Some(v) = desired
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .filter(|v| !v.is_empty())
                && parse_rv(v)? != rv_of(cur)
            {
                return Err(ApiError::conflict(rt, t.name()));
            }
            let replicas = scale_replicas(&desired, t.name())?;
            let mut new = (*cur).clone();
            new["spec"]["replicas"] = json!(replicas);
            Ok(new)
        },
        client_rv,
        Admission {
            options_kind: if patch.is_some() {
                "PatchOptions"
            } else {
                "UpdateOptions"
            },
            scale: true,
        },
    )
    .await?;
    Ok(match reply {
        Reply::Stored(code, o) => Reply::Json(code, scale_of(&o)),
        Reply::Json(code, o) => Reply::Json(code, scale_of(&o)),
        other => other,
    })
}

fn success_status(rt: &ResourceType, obj: &Value) -> Value {
    let mut details = json!({
        "name": obj.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
        "kind": rt.plural,
        "uid": obj.pointer("/metadata/uid").cloned().unwrap_or(Value::Null),
    });
    if !rt.group.is_empty() {
        details["group"] = json!(rt.group);
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    })
}

/// Whether DELETE answers with the object (kube-apiserver does for kinds with
/// graceful deletion or a lifecycle) rather than a Success Status.
fn returns_object(rt: &ResourceType) -> bool {
    rt.group.is_empty() && matches!(rt.plural, "pods" | "namespaces")
}

pub fn delete(sh: &Shared, t: &Target, q: &Query, body: Option<Value>) -> Result<Reply, ApiError> {
    let rt = t.rt();
    let pre_uid = body
        .as_ref()
        .and_then(|b| b.pointer("/preconditions/uid"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let pre_rv = body
        .as_ref()
        .and_then(|b| b.pointer("/preconditions/resourceVersion"))
        .and_then(Value::as_str)
        .map(str::to_string);
    loop {
        let cur = current_for_write(sh, t)?;
        let uid = cur
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("");
        if let Some(p) = &pre_uid
            && p != uid
        {
            return Err(ApiError::conflict_msg(
                rt,
                t.name(),
                &format!(
                    "Precondition failed: UID in precondition: {p}, UID in object meta: {uid}"
                ),
            ));
        }
        let cur_rv = rv_of(&cur);
        if let Some(p) = &pre_rv
            && *p != cur_rv.to_string()
        {
            return Err(ApiError::conflict_msg(
                rt,
                t.name(),
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {p}, ResourceVersion in object meta: {cur_rv}"
                ),
            ));
        }
        if dry_run(q) {
            return Ok(Reply::Stored(200, cur));
        }
        if rt.is_namespace() {
            return terminate_namespace(sh, t, cur);
        }
        let has_finalizers = cur
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        let result = if has_finalizers {
            if cur.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(Reply::Stored(200, cur));
            }
            sh.store
                .update(
                    t.resource,
                    t.ns(),
                    t.name(),
                    cur_rv,
                    objects::mark_deleting(&cur),
                )
                .map(|o| (o, true))
        } else {
            sh.store
                .delete(t.resource, t.ns(), t.name(), Some(cur_rv))
                .map(|o| (o, false))
        };
        match result {
            Ok((o, pending)) => {
                return Ok(if pending || returns_object(rt) {
                    Reply::Stored(200, o)
                } else {
                    Reply::Json(200, success_status(rt, &o))
                });
            }
            Err(StoreError::Changed) => continue,
            Err(e) => return Err(store_err(t, e)),
        }
    }
}

/// A namespace's deletion as kube-apiserver and the namespace controller
/// do it: marked `Terminating` at once (creations in it refused from then
/// on), then its content deleted one resource after another, every
/// [`crate::Config::namespace_teardown_step`], then the namespace. So a
/// watcher sees the content go while the rest still exists (a ConfigMap
/// deleted before the Deployment that uses it), as on a real cluster.
fn terminate_namespace(sh: &Shared, t: &Target, cur: Arc<Value>) -> Result<Reply, ApiError> {
    if cur.pointer("/metadata/deletionTimestamp").is_some() {
        return Ok(Reply::Stored(200, cur));
    }
    let marked = sh
        .store
        .terminate_namespace(t.name())
        .map_err(|e| store_err(t, e))?;
    let (store, name, step) = (
        sh.store.clone(),
        t.name().to_string(),
        sh.config.namespace_teardown_step,
    );
    tokio::spawn(async move {
        for (res, rt) in crate::resources::RESOURCES.iter().enumerate() {
            if rt.namespaced {
                tokio::time::sleep(step).await;
                store.delete_content(res, &name);
            }
        }
        tokio::time::sleep(step).await;
        let _ = store.delete(crate::resources::namespaces_id(), "", &name, None);
    });
    Ok(Reply::Stored(200, marked))
}

pub fn delete_collection(sh: &Shared, t: &Target, q: &Query) -> Result<Reply, ApiError> {
    let rt = t.rt();
    let sel = selectors(rt, q, None)?;
    let (items, _) = sh.store.list(t.resource, t.namespace.as_deref(), None)?;
    let mut deleted = Vec::new();
    for (key, obj) in items.iter().filter(|(_, o)| sel.matches(o)) {
        let it = Target {
            namespace: if rt.namespaced {
                Some(key.0.clone())
            } else {
                None
            },
            name: Some(key.1.clone()),
            ..t.clone()
        };
        match delete(sh, &it, q, None) {
            Ok(_) => deleted.push((**obj).clone()),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Reply::Json(
        200,
        json!({
            "kind": format!("{}List", rt.kind),
            "apiVersion": rt.api_version(),
            "metadata": { "resourceVersion": sh.store.resource_version().to_string() },
            "items": deleted,
        }),
    ))
}
