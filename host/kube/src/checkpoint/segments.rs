//! The stored index as a log of immutable segments: what a save writes and
//! what the state Lease names, without I/O.
//!
//! The stored index of every kind is the text of the segments applied in
//! order, then the tail (lines kept in the state Lease itself). A segment
//! is a Lease `<state>-segment-<seq>` whose annotation holds lines of
//! [`ObjectIndex::encode`] or [`ObjectIndex::delta`] in runs of one kind,
//! each run after its kind's mark (`#ConfigMap`, see [`join_kinds`]); every
//! segment starts with a mark, so each reads alone. It is created once and
//! never written again. (Format 2 kept one log and tail per kind, without
//! marks: a save of both kinds rewrote two tails and made two segments.)
//!
//! The state Lease names every segment of the stored index, so a save
//! commits with one conditional write of the state
//! Lease, whatever it wrote before: segments it created but did not name
//! are never read.
//!
//! A save appends its delta (what changed since the last commit) to the
//! tail while the tail stays under [`TAIL_BYTES`] (one write per save),
//! else writes tail and delta out as new segments, in tiers that merge
//! when full ([`TIER_SEGMENTS`]: a claim reads few segments). Once the
//! segments written since the last full rewrite outweigh that rewrite
//! (the `base`) [`COMPACT_FACTOR`] times, a save rewrites the whole index
//! instead (compaction): at most three times the index is ever stored.
//! Text is stored packed ([`pack`]: DEFLATE and base64).
//!
//! [`ObjectIndex::encode`]: wasmwatch_core::index::ObjectIndex::encode
//! [`ObjectIndex::delta`]: wasmwatch_core::index::ObjectIndex::delta

use std::collections::BTreeMap;

use wasmwatch_core::ObjectKind;

/// Largest tail kept in the state Lease, packed: smaller deltas wait there
/// (one write per save), so that segments are not made per save. Larger,
/// fewer writes; smaller, fewer bytes rewritten per save (the tail is in
/// every state write). Measured with `examples/state_bytes.rs` (10k
/// objects of both kinds, 1,200 saves of 200 changes, 13-14 full
/// rewrites; a segment created and later deleted is two writes; before
/// [`TAIL_SAVES`], though with these lines, ~9 KiB a save, 16 KiB writes
/// the tail out every second save already): 4 KiB 70
/// bytes and 0.0154 writes per change, 8 KiB 72 and 0.0149, 16 KiB 92 and
/// 0.0099, 24 KiB 114 and 0.0085, 32 KiB 135 and 0.0078.
pub const TAIL_BYTES: usize = 16 * 1024;

/// A save whose tail already holds this many saves' deltas writes it out
/// with its own as segments (once they pack to a quarter of
/// [`Sizes::tail`]; less waits, so that slow changes make few segments):
/// every save rewrites the tail, so a tail of many small deltas costs
/// more bytes than the segment writes it saves. Measured with
/// `examples/state_bytes.rs` (see [`TAIL_BYTES`]).
pub const TAIL_SAVES: usize = 2;

/// Below this, the log is not compacted whatever the base: a small index
/// is cheap to read.
pub const COMPACT_FLOOR: usize = 64 * 1024;

/// The limits a save plans with: production's ([`Sizes::with_segment`]),
/// or smaller in tests and the simulator, so that saves of a few objects
/// write several segments and rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// The largest stored segment (packed, see [`pack`]).
    pub segment: usize,
    /// The largest tail (packed): [`TAIL_BYTES`].
    pub tail: usize,
    /// Segments written since the last rewrite up to this never cause
    /// one: [`COMPACT_FLOOR`].
    pub compact_floor: usize,
    /// The most segments of a tier: [`TIER_SEGMENTS`].
    pub tier: usize,
}

impl Sizes {
    /// Segments of at most `segment` bytes, the rest production's.
    pub fn with_segment(segment: usize) -> Sizes {
        Sizes {
            segment,
            tail: TAIL_BYTES,
            compact_floor: COMPACT_FLOOR,
            tier: TIER_SEGMENTS,
        }
    }
}

/// The most segments a tier holds. The segments after the last full
/// rewrite (the base) are in tiers: a save's new segments join tier 0;
/// once a tier would hold more, it and every newer tier are merged into
/// one set of segments of the next tier: their objects' lines as they are
/// now, each once (what changed since the oldest of them began). Small
/// deltas make small segments, and a new leader reads every segment with
/// one request: without merges a log grew to ~2,400 segments before its
/// full rewrite (200k objects, patch lines of ~20 bytes a change) and a
/// claim read 616 of them in 3.2 s. With tiers of 16, each tier's
/// segments are ~16 times the size of the last tier's, so a claim reads
/// the base and at most 16 segments a tier, the tiers bounded by the full
/// rewrite ([`COMPACT_FACTOR`]). Measured with `examples/state_bytes.rs`:
/// see ARCHITECTURE.md.
pub const TIER_SEGMENTS: usize = 16;

/// The whole index is rewritten once the segments written since its last
/// rewrite outweigh it this many times: the store holds at most about
/// `1 + COMPACT_FACTOR` times the index (what a new leader reads), and a
/// change is written about `1 + 1 / COMPACT_FACTOR` times.
pub const COMPACT_FACTOR: usize = 2;

/// The stored index as the state Lease names it:
/// `segments=3-9,12 bytes=4096 base=2048 kinds=ConfigMap,Secret`
/// (annotation `wasmwatch.io/index-log`; format 2's per-kind
/// `wasmwatch.io/<kind>-index-log` has no `kinds`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    /// The kinds whose index it holds (one without lines is empty, not
    /// missing).
    pub kinds: Vec<ObjectKind>,
    /// Sequence numbers of the segments, in the order they apply.
    pub segments: Vec<u64>,
    /// Bytes of every segment's text.
    pub bytes: usize,
    /// Bytes of the segments of the last full rewrite.
    pub base: usize,
    /// The tiers of the segments after the base, newest first (see
    /// [`TIER_SEGMENTS`]): how many of the last segments each holds, and
    /// their bytes. `tiers=3/9000,1/50000`; none written when all are
    /// empty.
    pub tiers: Vec<(usize, usize)>,
}

/// What one kind's part of a save writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// New segments to create first: sequence number and text.
    pub create: Vec<(u64, String)>,
    /// The log the state Lease names once they exist.
    pub log: Log,
    /// The tail the state Lease holds.
    pub tail: String,
    /// Segments no longer named once committed (to delete after).
    pub dropped: Vec<u64>,
    /// How many of the newest tiers start anew from the new index (a
    /// merge of them: they are empty now; a rewrite: all,
    /// `usize::MAX`): a later merge of one writes what changed since.
    pub rebased: usize,
}

impl Log {
    /// Reads [`Log::format`]'s text.
    pub fn parse(value: &str) -> Result<Log, String> {
        let mut log = Log::default();
        for field in value.split_whitespace() {
            let (k, v) = field
                .split_once('=')
                .ok_or_else(|| format!("{field:?}: expected key=value"))?;
            let number = |v: &str| {
                v.parse::<usize>()
                    .map_err(|_| format!("{field:?}: not a number"))
            };
            match k {
                "segments" => log.segments = parse_seqs(v)?,
                "bytes" => log.bytes = number(v)?,
                "base" => log.base = number(v)?,
                "tiers" => {
                    log.tiers = v
                        .split(',')
                        .map(|t| {
                            let (n, b) = t.split_once('/').ok_or_else(|| {
                                format!("{field:?}: expected tiers=count/bytes,...")
                            })?;
                            Ok((number(n)?, number(b)?))
                        })
                        .collect::<Result<_, String>>()?
                }
                "kinds" => {
                    log.kinds = v
                        .split(',')
                        .filter(|k| !k.is_empty())
                        .map(|k| {
                            kind_named(k).ok_or_else(|| format!("{field:?}: unknown kind {k:?}"))
                        })
                        .collect::<Result<_, _>>()?
                }
                _ => return Err(format!("{field:?}: unknown field")),
            }
        }
        Ok(log)
    }

    pub fn format(&self) -> String {
        let mut out = format!(
            "segments={} bytes={} base={}",
            format_seqs(&self.segments),
            self.bytes,
            self.base
        );
        if !self.tiers.is_empty() {
            let tiers: Vec<String> = self.tiers.iter().map(|(n, b)| format!("{n}/{b}")).collect();
            out.push_str(&format!(" tiers={}", tiers.join(",")));
        }
        if !self.kinds.is_empty() {
            let kinds: Vec<&str> = self.kinds.iter().map(|k| k.as_str()).collect();
            out.push_str(&format!(" kinds={}", kinds.join(",")));
        }
        out
    }

    /// What a save that changes the index by `delta` writes, with the
    /// current `tail` (holding the deltas of `tail_saves` saves), new
    /// segments numbered from `next` (advanced); `full` gives the whole
    /// new index's text if it is rewritten, `merged(k)` what changed since
    /// tier `k` began (the index before its first segment) if tiers `0..=k`
    /// are merged.
    pub fn plan(
        &self,
        (tail, tail_saves): (&str, usize),
        delta: &str,
        full: impl FnOnce() -> String,
        merged: impl FnOnce(usize) -> String,
        next: &mut u64,
        sizes: Sizes,
    ) -> Plan {
        let max = sizes.segment;
        let text = format!("{tail}{delta}");
        // The tail is stored packed: its limits are on that.
        let packed = if delta.is_empty() {
            0
        } else {
            pack(&text).len()
        };
        let full_tail = packed > sizes.tail;
        let saves_enough = tail_saves >= TAIL_SAVES && packed >= sizes.tail / 4;
        if !full_tail && !saves_enough {
            return Plan {
                create: Vec::new(),
                log: self.clone(),
                tail: text,
                dropped: Vec::new(),
                rebased: 0,
            };
        }
        let mut parts = pack_parts(&text, max);
        let mut log = self.clone();
        let limit = sizes.tier.max(1);
        let count = |log: &Log, k: usize| log.tiers.get(k).map_or(0, |t| t.0);
        // Tiers 0..=k merged, into tier k + 1.
        let merge = (count(&log, 0) + parts.len() > limit).then(|| {
            let mut k = 0;
            while count(&log, k + 1) + 1 > limit {
                k += 1;
            }
            k
        });
        let mut dropped = Vec::new();
        if let Some(k) = merge {
            parts = pack_parts(&merged(k), max);
            log.tiers.resize(log.tiers.len().max(k + 2), (0, 0));
            let (n, bytes) = log.tiers[..=k]
                .iter_mut()
                .map(std::mem::take)
                .fold((0, 0), |(n, b), (tn, tb)| (n + tn, b + tb));
            let kept = log.segments.len() - n.min(log.segments.len());
            dropped = log.segments.split_off(kept);
            log.bytes -= bytes.min(log.bytes);
        }
        let added: usize = parts.iter().map(String::len).sum();
        let written = log.bytes - log.base.min(log.bytes) + added;
        if written > (COMPACT_FACTOR * log.base).max(sizes.compact_floor) {
            return self.rewrite(&full(), next, max);
        }
        let create = numbered(parts, next);
        log.segments.extend(create.iter().map(|(n, _)| *n));
        log.bytes += added;
        let into = merge.map_or(0, |k| k + 1);
        log.tiers.resize(log.tiers.len().max(into + 1), (0, 0));
        log.tiers[into].0 += create.len();
        log.tiers[into].1 += added;
        while log.tiers.last() == Some(&(0, 0)) {
            log.tiers.pop();
        }
        Plan {
            create,
            log,
            tail: String::new(),
            dropped,
            rebased: into,
        }
    }

    /// Where each tier's segments begin in [`Log::segments`], newest tier
    /// first: a tier's index base is the index read before that position
    /// (an empty tier begins where the next newer one does). One entry
    /// at least (tier 0).
    pub fn tier_starts(&self) -> Vec<usize> {
        let mut at = self.segments.len();
        let mut starts = Vec::new();
        for (n, _) in &self.tiers {
            at -= (*n).min(at);
            starts.push(at);
        }
        if starts.is_empty() {
            starts.push(at);
        }
        starts
    }
}

impl Log {
    /// A save that writes the whole index (`full`) as new segments, and
    /// drops every segment named now.
    pub fn rewrite(&self, full: &str, next: &mut u64, max: usize) -> Plan {
        let create = numbered(pack_parts(full, max), next);
        let bytes = create.iter().map(|(_, t)| t.len()).sum();
        Plan {
            log: Log {
                kinds: self.kinds.clone(),
                segments: create.iter().map(|(n, _)| *n).collect(),
                bytes,
                base: bytes,
                tiers: Vec::new(),
            },
            create,
            tail: String::new(),
            dropped: self.segments.clone(),
            rebased: usize::MAX,
        }
    }
}

/// The mark of packed text: `z1:` and the base64 of its raw DEFLATE.
const PACKED: &str = "z1:";

/// Text of index lines as stored: DEFLATE, then base64 (annotations are
/// strings). Hex hashes and repeated names and labels pack to a fifth or
/// less of the lines (measured in `examples/state_bytes.rs`).
pub fn pack(text: &str) -> String {
    use base64::Engine;
    use std::io::Write;
    let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(text.as_bytes()).expect("writing to memory");
    let bytes = z.finish().expect("writing to memory");
    format!(
        "{PACKED}{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// Reads [`pack`]'s text; text without its mark is plain lines (segments
/// and shards written before packing).
pub fn unpack(stored: &str) -> Result<std::borrow::Cow<'_, str>, String> {
    use base64::Engine;
    use std::io::Read;
    let Some(b64) = stored.strip_prefix(PACKED) else {
        return Ok(std::borrow::Cow::Borrowed(stored));
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|e| format!("packed index: {e}"))?;
    let mut text = String::new();
    flate2::read::DeflateDecoder::new(&bytes[..])
        .read_to_string(&mut text)
        .map_err(|e| format!("packed index: {e}"))?;
    Ok(std::borrow::Cow::Owned(text))
}

/// `text` packed in parts of whole lines, each at most `max` bytes packed
/// (a part that packs larger is halved; one line alone is kept whole).
/// A part that would start inside a run of one kind (see [`join_kinds`])
/// starts with that kind's mark again, so that each part reads alone.
pub fn pack_parts(text: &str, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut mark: Option<String> = None;
    // Raw text taken a part at a time, sized by how well the last part
    // packed: index lines with remembered metadata pack ~18 times, bare
    // hex ~2 times. (A fixed 4 times `max` made the segments of a 200k
    // index 44 KB each: 135 of them where 30 hold it.)
    let mut raw = 4 * max;
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = raw.min(rest.len());
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let cut = match rest[..end].rfind('\n') {
            _ if rest.len() <= raw => rest.len(),
            Some(i) => i + 1,
            None => rest.find('\n').map_or(rest.len(), |i| i + 1),
        };
        let (part, after) = rest.split_at(cut);
        rest = after;
        let part = headed(mark.as_deref(), part.to_string());
        if let Some(m) = last_mark(&part) {
            mark = Some(m.to_string());
        }
        let before = out.len();
        pack_into(&part, max, &mut out);
        let packed: usize = out[before..].iter().map(String::len).sum();
        raw = (part.len() * (max - max / 8) / packed.max(1)).clamp(max, 64 * max);
    }
    out.retain(|p| p != &pack(""));
    out
}

fn pack_into(part: &str, max: usize, out: &mut Vec<String>) {
    let packed = pack(part);
    let lines: Vec<&str> = part.split_inclusive('\n').collect();
    // Index lines, not marks: one alone is kept whole (with its mark).
    let content: Vec<usize> = (0..lines.len())
        .filter(|&i| !lines[i].starts_with(KIND_MARK))
        .collect();
    if packed.len() <= max || content.len() < 2 {
        out.push(packed);
        return;
    }
    // Before the middle index line: each half has at least one, so the
    // second, headed with its mark again, is smaller than `part`.
    let (a, b) = lines.split_at(content[content.len() / 2]);
    let a = a.concat();
    let b = headed(last_mark(&a), b.concat());
    pack_into(&a, max, out);
    pack_into(&b, max, out);
}

/// `part` with `mark` (a kind's mark line) before it, unless it has lines
/// and starts with a mark of its own.
fn headed(mark: Option<&str>, part: String) -> String {
    match mark {
        Some(m) if !part.is_empty() && !part.starts_with(KIND_MARK) => format!("{m}{part}"),
        _ => part,
    }
}

/// The last kind's mark line in `text`, with its newline.
fn last_mark(text: &str) -> Option<&str> {
    text.split_inclusive('\n')
        .rev()
        .find(|l| l.starts_with(KIND_MARK))
}

/// The first character of a kind's mark line: no index line starts with
/// it (a namespace is a DNS label).
const KIND_MARK: char = '#';

/// The kind [`ObjectKind::as_str`] names (a custom kind's name is
/// interned, so that state of a kind no longer watched is still read and
/// kept).
pub fn kind_named(name: &str) -> Option<ObjectKind> {
    ObjectKind::parse(name).ok()
}

/// Lines of several kinds as one text: each kind's lines after its mark
/// (`#ConfigMap`); kinds without lines are left out.
pub fn join_kinds<S: AsRef<str>>(parts: impl IntoIterator<Item = (ObjectKind, S)>) -> String {
    let mut out = String::new();
    for (kind, lines) in parts {
        let lines = lines.as_ref();
        if !lines.is_empty() {
            out.push(KIND_MARK);
            out.push_str(kind.as_str());
            out.push('\n');
            out.push_str(lines);
        }
    }
    out
}

/// [`join_kinds`]'s text back as each kind's lines, in order. Lines before
/// any mark, or after the mark of a kind not in `kinds`, are an error.
pub fn split_kinds(
    text: &str,
    kinds: &[ObjectKind],
) -> Result<BTreeMap<ObjectKind, String>, String> {
    let mut out: BTreeMap<ObjectKind, String> = BTreeMap::new();
    let mut kind = None;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        if let Some(name) = line.strip_prefix(KIND_MARK) {
            let name = name.trim_end();
            kind = Some(
                kind_named(name)
                    .filter(|k| kinds.contains(k))
                    .ok_or_else(|| {
                        format!("line {}: {name:?} is not a kind of this index", i + 1)
                    })?,
            );
        } else if !line.trim().is_empty() {
            let kind =
                kind.ok_or_else(|| format!("line {}: index lines before any kind", i + 1))?;
            out.entry(kind).or_default().push_str(line);
        }
    }
    Ok(out)
}

/// What [`fit_lines`] did to lines over a segment: objects whose entry
/// was stored shortened ([`wasmwatch_core::index::shortened_line`]), and
/// objects stored as removed (a patch line, or a name too long even so).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Unfit {
    pub shortened: Vec<String>,
    pub removed: Vec<String>,
}

/// `text` with every line over `max` bytes (an object with thousands of
/// keys) replaced by its entry without key hashes and remembered labels,
/// or, where that is no entry or still too long, by its object's
/// removal: such a line would make a segment the API server refuses,
/// and every save would fail. A shortened entry keeps the object known
/// (its deletion in a gap past the history is found); a removed one is
/// delivered again at a resync, and its deletion in such a gap is not
/// seen.
pub fn fit_lines(text: &str, max: usize) -> (std::borrow::Cow<'_, str>, Unfit) {
    let mut unfit = Unfit::default();
    if !text.split_inclusive('\n').any(|l| l.len() > max) {
        return (std::borrow::Cow::Borrowed(text), unfit);
    }
    let mut out = String::new();
    for line in text.split_inclusive('\n') {
        if line.len() <= max {
            out.push_str(line);
            continue;
        }
        let id = line.split(' ').next().unwrap_or_default();
        match wasmwatch_core::index::shortened_line(line).filter(|l| l.len() <= max) {
            Some(short) => {
                out.push_str(&short);
                unfit.shortened.push(id.to_string());
            }
            None => {
                out.push_str(id);
                out.push_str(" -\n");
                unfit.removed.push(id.to_string());
            }
        }
    }
    (std::borrow::Cow::Owned(out), unfit)
}

/// Numbers non-empty texts from `next` on.
fn numbered(texts: Vec<String>, next: &mut u64) -> Vec<(u64, String)> {
    texts
        .into_iter()
        .filter(|t| !t.is_empty())
        .map(|t| {
            let n = *next;
            *next += 1;
            (n, t)
        })
        .collect()
}

/// Splits text of lines into parts under `max` bytes, at line boundaries
/// (a line longer than `max` is a part of its own).
pub fn split_lines(text: &str, max: usize) -> Vec<String> {
    let mut parts = vec![String::new()];
    for line in text.split_inclusive('\n') {
        let last = parts.last_mut().expect("one part");
        if !last.is_empty() && last.len() + line.len() > max {
            parts.push(String::new());
        }
        parts.last_mut().expect("one part").push_str(line);
    }
    parts
}

/// `3-9,12` → [3, 4, ..., 9, 12].
pub fn parse_seqs(v: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for part in v.split(',').filter(|p| !p.is_empty()) {
        let bad = || format!("{part:?}: expected a number or a range a-b");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u64, u64) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if b < a || b - a > 1_000_000 {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(out)
}

/// The inverse of [`parse_seqs`]: runs of consecutive numbers as ranges.
pub fn format_seqs(seqs: &[u64]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < seqs.len() {
        let mut j = i;
        while j + 1 < seqs.len() && seqs[j + 1] == seqs[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}-{}", seqs[i], seqs[j])
        } else {
            seqs[i].to_string()
        });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_too_long_for_a_segment_is_shortened_or_else_its_objects_removal() {
        let text = format!("a/x 1\na/big {}\na/y 2\n", "k".repeat(50));
        let (fit, unfit) = fit_lines(&text, 20);
        assert_eq!(fit, "a/x 1\na/big -\na/y 2\n");
        assert_eq!(unfit.removed, ["a/big"]);
        // An entry: its key hashes and remembered labels go, its digests
        // and keying stay, and it still reads as the object's entry.
        let (d, m) = ("00000000000000aa", "00000000000000bb");
        let keys: Vec<String> = (0..2000)
            .map(|i| format!("key-{i}=00000000000000cc"))
            .collect();
        let keyed = format!(
            "a/big {d} {m} {} {{\"a\":{{\"x\":\"y\"}},\"k\":true}}\n",
            keys.join(";")
        );
        let plain = format!("a/plain {d} {m} {}\n", keys.join(";"));
        let patch = format!("a/patched + {d} {}\n", keys.join(";"));
        let text = format!("{keyed}{plain}{patch}");
        let (fit, unfit) = fit_lines(&text, 100);
        assert_eq!(
            fit,
            format!("a/big {d} {m}  {{\"k\":true}}\na/plain {d} {m} \na/patched -\n")
        );
        assert_eq!(unfit.shortened, ["a/big", "a/plain"]);
        assert_eq!(unfit.removed, ["a/patched"]);
        let index = wasmwatch_core::index::ObjectIndex::decode(ObjectKind::Secret, &fit).unwrap();
        assert_eq!(index.len(), 2);
        assert!(matches!(
            fit_lines("a/x 1\n", 20).0,
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn lines_of_several_kinds_split_back_in_order_and_every_part_reads_alone() {
        use ObjectKind::{ConfigMap, Secret};
        let both = [ConfigMap, Secret];
        let text = join_kinds([(ConfigMap, "a/x 1\n"), (Secret, ""), (ConfigMap, "a/y 2\n")]);
        assert_eq!(text, "#ConfigMap\na/x 1\n#ConfigMap\na/y 2\n");
        let text = format!("{text}{}", join_kinds([(Secret, "b/s 3\n")]));
        let split = split_kinds(&text, &both).unwrap();
        assert_eq!(split[&ConfigMap], "a/x 1\na/y 2\n");
        assert_eq!(split[&Secret], "b/s 3\n");
        assert!(split_kinds(&text, &[ConfigMap]).is_err(), "a kind not held");
        assert!(
            split_kinds("a/x 1\n", &both).is_err(),
            "lines without a kind"
        );
        assert!(split_kinds("#Pod\na/x 1\n", &both).is_err());

        // Split into many parts, each starts with its kind's mark.
        let cms = lines(3000, 1);
        let secrets = lines(3000, 2);
        let text = join_kinds([(ConfigMap, &cms), (Secret, &secrets)]);
        let parts = pack_parts(&text, 4000);
        assert!(parts.len() > 4);
        let mut back: BTreeMap<ObjectKind, String> = BTreeMap::new();
        for p in &parts {
            let part = unpack(p).unwrap();
            assert!(part.starts_with('#'), "{}", &part[..40]);
            for (k, l) in split_kinds(&part, &both).unwrap() {
                back.entry(k).or_default().push_str(&l);
            }
        }
        assert_eq!((&back[&ConfigMap], &back[&Secret]), (&cms, &secrets));
    }

    #[test]
    fn a_kind_mark_with_lines_too_large_to_split_further_is_kept_whole() {
        use ObjectKind::{ConfigMap, Secret};
        // Lines that alone pack larger than a part may be.
        let big = |i: usize| {
            let keys = lines(40, i as u64).replace('\n', ";");
            format!("{} {keys}\n", lines(1, i as u64).trim_end())
        };
        for n in 1..=4 {
            let cms: String = (0..n).map(big).collect();
            let text = join_kinds([(ConfigMap, cms.as_str()), (Secret, big(9).as_str())]);
            let parts = pack_parts(&text, 200);
            let mut back: BTreeMap<ObjectKind, String> = BTreeMap::new();
            for p in &parts {
                let part = unpack(p).unwrap();
                assert!(part.starts_with('#'));
                for (k, l) in split_kinds(&part, &[ConfigMap, Secret]).unwrap() {
                    back.entry(k).or_default().push_str(&l);
                }
            }
            assert_eq!(back[&ConfigMap], cms);
            assert_eq!(back[&Secret], big(9));
        }
    }

    #[test]
    fn logs_and_sequence_lists_round_trip() {
        let log = Log {
            kinds: Vec::new(),
            segments: vec![3, 4, 5, 9, 11, 12],
            bytes: 4096,
            base: 2048,
            tiers: Vec::new(),
        };
        assert_eq!(log.format(), "segments=3-5,9,11-12 bytes=4096 base=2048");
        assert_eq!(Log::parse(&log.format()).unwrap(), log);
        let log = Log {
            kinds: vec![ObjectKind::ConfigMap, ObjectKind::Secret],
            ..log
        };
        assert_eq!(
            log.format(),
            "segments=3-5,9,11-12 bytes=4096 base=2048 kinds=ConfigMap,Secret"
        );
        assert_eq!(Log::parse(&log.format()).unwrap(), log);
        let log = Log {
            tiers: vec![(2, 700), (0, 0), (1, 9000)],
            ..log
        };
        assert_eq!(
            log.format(),
            "segments=3-5,9,11-12 bytes=4096 base=2048 tiers=2/700,0/0,1/9000 kinds=ConfigMap,Secret"
        );
        assert_eq!(Log::parse(&log.format()).unwrap(), log);
        assert_eq!(log.tier_starts(), [4, 4, 3]);
        assert!(Log::parse("tiers=2").is_err());
        assert!(Log::parse("segments=1 kinds=Pod").is_err());
        assert_eq!(
            Log::parse("segments= bytes=0 base=0").unwrap(),
            Log::default()
        );
        assert!(Log::parse("segments=3-x").is_err());
        assert!(Log::parse("segments=9-3").is_err());
        assert!(Log::parse("size=3").is_err());
    }

    /// Index-like lines: hex hashes do not pack to nothing.
    fn lines(n: usize, salt: u64) -> String {
        (0..n)
            .map(|i| {
                let h = (i as u64 + salt).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                format!("ns/cm-{i} {h:032x} {:016x} k={:016x}\n", h >> 3, h >> 7)
            })
            .collect()
    }

    #[test]
    fn packed_text_round_trips_and_plain_text_reads_as_is() {
        let text = lines(1000, 1);
        let packed = pack(&text);
        assert!(packed.starts_with("z1:") && packed.len() < text.len() / 2);
        assert_eq!(unpack(&packed).unwrap(), text);
        assert_eq!(unpack("a/x 1\n").unwrap(), "a/x 1\n");
        assert!(unpack("z1:!!").is_err());
        let parts = pack_parts(&text, 4000);
        assert!(parts.len() > 1 && parts.iter().all(|p| p.len() <= 4000));
        let back: String = parts.iter().map(|p| unpack(p).unwrap()).collect();
        assert_eq!(back, text);
    }

    #[test]
    fn small_deltas_wait_in_the_tail_and_larger_ones_become_segments() {
        let mut next = 10;
        let log = Log {
            kinds: Vec::new(),
            segments: vec![1],
            bytes: 100_000,
            base: 100_000,
            tiers: Vec::new(),
        };
        let p = log.plan(
            ("a x\n", 1),
            "b y\n",
            || unreachable!(),
            |_| unreachable!(),
            &mut next,
            Sizes::with_segment(1000),
        );
        assert!(p.create.is_empty());
        assert_eq!(p.tail, "a x\nb y\n");
        assert_eq!(p.log, log);

        let delta = lines(TAIL_BYTES / 10, 7);
        let p = log.plan(
            ("a x\n", 1),
            &delta,
            || unreachable!(),
            |_| unreachable!(),
            &mut next,
            Sizes::with_segment(5_000),
        );
        assert_eq!(next, 10 + p.create.len() as u64);
        assert!(p.create.len() > 1);
        assert!(p.create.iter().all(|(_, t)| t.len() <= 5_000));
        let written: String = p.create.iter().map(|(_, t)| unpack(t).unwrap()).collect();
        assert_eq!(written, format!("a x\n{delta}"));
        assert_eq!(p.tail, "");
        assert_eq!(p.log.segments[0], 1);
        let packed: usize = p.create.iter().map(|(_, t)| t.len()).sum();
        assert_eq!(p.log.bytes, 100_000 + packed);
        assert!(p.dropped.is_empty());
    }

    #[test]
    fn a_tail_of_enough_saves_is_written_out_before_it_is_full() {
        let log = Log::default();
        let sizes = Sizes::with_segment(200 * 1024);
        let mut next = 0;
        // About a third of the tail limit a save.
        let delta = lines(200, 9);
        let third = pack(&delta).len();
        assert!(third > TAIL_BYTES / 4 && third < TAIL_BYTES / 2, "{third}");
        let first = log.plan(
            ("", 0),
            &delta,
            || unreachable!(),
            |_| unreachable!(),
            &mut next,
            sizes,
        );
        assert!(first.create.is_empty());
        let second = log.plan(
            (&first.tail, 1),
            &delta,
            || unreachable!(),
            |_| unreachable!(),
            &mut next,
            sizes,
        );
        assert!(second.create.is_empty(), "two saves' deltas wait");
        let third = log.plan(
            (&second.tail, 2),
            &delta,
            || unreachable!(),
            |_| unreachable!(),
            &mut next,
            sizes,
        );
        assert_eq!(third.create.len(), 1, "the third writes them out");
        assert_eq!(third.tail, "");
        // Slow changes wait whatever the number of saves, and a save
        // without changes keeps the tail as it is.
        let small = lines(3, 4);
        let p = log.plan(
            ("a x\n", 9),
            &small,
            || unreachable!(),
            |_| unreachable!(),
            &mut next,
            sizes,
        );
        assert!(p.create.is_empty());
        let p = log.plan(
            (&second.tail, 5),
            "",
            || unreachable!(),
            |_| unreachable!(),
            &mut next,
            sizes,
        );
        assert!(p.create.is_empty() && p.tail == second.tail);
    }

    #[test]
    fn the_whole_index_is_rewritten_once_the_segments_since_the_last_rewrite_outweigh_it() {
        let mut next = 20;
        let delta = lines(2000, 3);
        let packed: usize = pack_parts(&delta, 50_000).iter().map(String::len).sum();
        // Written since the base, with this delta: just under twice the base.
        let log = Log {
            kinds: Vec::new(),
            segments: vec![1, 2, 7],
            bytes: 300_000 - packed,
            base: 100_000,
            tiers: Vec::new(),
        };
        let p = log.plan(
            ("", 0),
            &delta,
            || unreachable!(),
            |_| unreachable!(),
            &mut next,
            Sizes::with_segment(50_000),
        );
        assert_eq!(p.log.segments[..3], [1, 2, 7]);
        assert!(p.dropped.is_empty());
        // A little more passes it: everything is rewritten.
        let log = Log {
            bytes: 300_001 - packed,
            ..log
        };
        let full = lines(40_000, 5);
        let p = log.plan(
            ("", 0),
            &delta,
            || full.clone(),
            |_| unreachable!(),
            &mut next,
            Sizes::with_segment(50_000),
        );
        assert!(p.log.segments.iter().all(|n| *n > 7));
        let stored: usize = p.create.iter().map(|(_, t)| t.len()).sum();
        assert_eq!((p.log.bytes, p.log.base), (stored, stored));
        let back: String = p.create.iter().map(|(_, t)| unpack(t).unwrap()).collect();
        assert_eq!(back, full);
        assert_eq!(p.dropped, [1, 2, 7]);
        assert_eq!(p.tail, "");
    }

    /// Segments join tier 0 until it would pass `Sizes::tier`; then tier
    /// 0, the tail and the delta become the merged text (what changed
    /// since tier 0 began) in tier 1, and once tier 1 is full, tiers 0 and
    /// 1 merge into tier 2; the base stays. A merge past the compaction
    /// rule rewrites instead.
    #[test]
    fn a_full_tier_is_merged_with_the_newer_ones_into_the_next() {
        let sizes = Sizes {
            tier: 2,
            ..Sizes::with_segment(200 * 1024)
        };
        let mut next = 10;
        let mut log = Log {
            kinds: Vec::new(),
            segments: vec![1, 2],
            bytes: 1_000_000,
            base: 1_000_000,
            tiers: Vec::new(),
        };
        let delta = lines(2000, 9);
        let mut seen = Vec::new();
        for _ in 0..8 {
            let mut asked = None;
            let p = log.plan(
                ("", 0),
                &delta,
                || unreachable!(),
                |k| {
                    asked = Some(k);
                    lines(100 * (k + 1), k as u64)
                },
                &mut next,
                sizes,
            );
            assert_eq!(p.create.len(), 1);
            assert_eq!(p.rebased, asked.map_or(0, |k| k + 1));
            let bytes: usize = p.log.tiers.iter().map(|t| t.1).sum();
            assert_eq!(p.log.bytes, 1_000_000 + bytes, "{:?}", p.log);
            assert_eq!(p.log.segments[..2], [1, 2], "the base stays");
            let counts: Vec<usize> = p.log.tiers.iter().map(|t| t.0).collect();
            let named: usize = counts.iter().sum();
            assert_eq!(p.log.segments.len(), 2 + named);
            let gone: Vec<u64> = log
                .segments
                .iter()
                .filter(|n| !p.log.segments.contains(n))
                .copied()
                .collect();
            assert_eq!(p.dropped, gone);
            seen.push((asked, counts));
            log = p.log;
        }
        assert_eq!(
            seen,
            [
                (None, vec![1]),
                (None, vec![2]),
                (Some(0), vec![0, 1]),
                (None, vec![1, 1]),
                (None, vec![2, 1]),
                (Some(0), vec![0, 2]),
                (None, vec![1, 2]),
                (None, vec![2, 2]),
            ]
        );
        let p = log.plan(
            ("", 0),
            &delta,
            || unreachable!(),
            |k| lines(100 * (k + 1), k as u64),
            &mut next,
            sizes,
        );
        assert_eq!(p.rebased, 2, "tiers 0 and 1 merged");
        assert_eq!(
            p.log.tiers.iter().map(|t| t.0).collect::<Vec<_>>(),
            [0, 0, 1]
        );
        assert_eq!(unpack(&p.create[0].1).unwrap(), lines(200, 1));
        assert_eq!(p.log.segments, [1, 2, p.create[0].0]);
        // A merge that would pass the compaction rule rewrites instead.
        let small = Log {
            bytes: 10,
            base: 10,
            ..log.clone()
        };
        let full = lines(100, 1);
        let p = small.plan(
            ("", 0),
            &delta,
            || full.clone(),
            |k| lines(100 * (k + 1), k as u64),
            &mut next,
            Sizes {
                compact_floor: 0,
                ..sizes
            },
        );
        assert_eq!(p.rebased, usize::MAX);
        assert_eq!(p.dropped, log.segments);
        assert_eq!(p.log.base, p.log.bytes);
        assert!(p.log.tiers.is_empty());
    }

    /// Raw text is cut by how well it packs: parts of well-packing lines
    /// fill a segment, not a quarter of one, and every part still fits.
    #[test]
    fn parts_are_sized_by_how_well_the_text_packs() {
        // Lines that pack ~20 times (remembered metadata, repeated).
        let text: String = (0..40_000)
            .map(|i| format!("ns/cm-{i} {i:016x} {{\"labels\":{{\"app.kubernetes.io/managed-by\":\"Helm\",\"helm.sh/chart\":\"web-1.2.3\"}}}}\n"))
            .collect();
        let max = 8 * 1024;
        let parts = pack_parts(&text, max);
        assert!(parts.iter().all(|p| p.len() <= max));
        let stored: usize = parts.iter().map(String::len).sum();
        assert!(
            parts.len() <= stored / (max / 2) + 2,
            "{} parts for {stored} bytes",
            parts.len()
        );
        let back: String = parts.iter().map(|p| unpack(p).unwrap()).collect();
        assert_eq!(back, text);
    }
}
