//! The stored index as a log of immutable segments: what a save writes and
//! what the state Lease names, without I/O.
//!
//! One kind's stored index is the text of its segments applied in order,
//! then the tail (lines kept in the state Lease itself). A segment is a
//! Lease `<state>-segment-<seq>` whose annotation holds lines of
//! [`ObjectIndex::encode`] or [`ObjectIndex::delta`]; it is created once
//! and never written again. The state Lease names every segment of the
//! stored index, so a save commits with one conditional write of the state
//! Lease, whatever it wrote before: segments it created but did not name
//! are never read.
//!
//! A save appends its delta (what changed since the last commit) to the
//! tail while the tail stays under [`TAIL_BYTES`] (one write per save),
//! else writes tail and delta out as new segments. Once the segments
//! written since the last full rewrite outweigh that rewrite (the `base`),
//! a save rewrites the whole index instead (compaction): at most twice the
//! index is ever stored, and each change is written about twice.
//!
//! [`ObjectIndex::encode`]: wasmwatch_core::index::ObjectIndex::encode
//! [`ObjectIndex::delta`]: wasmwatch_core::index::ObjectIndex::delta

/// Largest tail kept in the state Lease: smaller deltas wait there (one
/// write per save), so that a quiet cluster does not make a segment per
/// save.
pub const TAIL_BYTES: usize = 16 * 1024;

/// Below this, the log is not compacted whatever the base: a small index
/// is cheap to read.
pub const COMPACT_FLOOR: usize = 64 * 1024;

/// One kind's stored index as the state Lease names it:
/// `segments=3-9,12 bytes=4096 base=2048` (annotation
/// `wasmwatch.io/<kind>-index-log`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    /// Sequence numbers of the segments, in the order they apply.
    pub segments: Vec<u64>,
    /// Bytes of every segment's text.
    pub bytes: usize,
    /// Bytes of the segments of the last full rewrite.
    pub base: usize,
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
                _ => return Err(format!("{field:?}: unknown field")),
            }
        }
        Ok(log)
    }

    pub fn format(&self) -> String {
        format!(
            "segments={} bytes={} base={}",
            format_seqs(&self.segments),
            self.bytes,
            self.base
        )
    }

    /// What a save that changes this kind's index by `delta` writes, with
    /// the current `tail`, new segments numbered from `next` (advanced),
    /// and `full` giving the whole new index's text if it is rewritten.
    /// `max` is the largest segment text.
    pub fn plan(
        &self,
        tail: &str,
        delta: &str,
        full: impl FnOnce() -> String,
        next: &mut u64,
        max: usize,
    ) -> Plan {
        let written = self.bytes - self.base.min(self.bytes) + tail.len() + delta.len();
        if written > self.base.max(COMPACT_FLOOR) {
            return self.rewrite(&full(), next, max);
        }
        if tail.len() + delta.len() <= TAIL_BYTES {
            return Plan {
                create: Vec::new(),
                log: self.clone(),
                tail: format!("{tail}{delta}"),
                dropped: Vec::new(),
            };
        }
        let create = numbered(split_lines(&format!("{tail}{delta}"), max), next);
        let mut log = self.clone();
        log.segments.extend(create.iter().map(|(n, _)| *n));
        log.bytes += create.iter().map(|(_, t)| t.len()).sum::<usize>();
        Plan {
            create,
            log,
            tail: String::new(),
            dropped: Vec::new(),
        }
    }
}

impl Log {
    /// A save that writes the whole index (`full`) as new segments, and
    /// drops every segment named now.
    pub fn rewrite(&self, full: &str, next: &mut u64, max: usize) -> Plan {
        let create = numbered(split_lines(full, max), next);
        let bytes = create.iter().map(|(_, t)| t.len()).sum();
        Plan {
            log: Log {
                segments: create.iter().map(|(n, _)| *n).collect(),
                bytes,
                base: bytes,
            },
            create,
            tail: String::new(),
            dropped: self.segments.clone(),
        }
    }
}

/// `text` with every line over `max` bytes (an object with thousands of
/// keys) replaced by its object's removal, and those objects' names: such
/// an entry would make a segment the API server refuses, and every save
/// would fail; without it, only that object is delivered again at a
/// resync.
pub fn fit_lines(text: &str, max: usize) -> (std::borrow::Cow<'_, str>, Vec<String>) {
    if !text.split_inclusive('\n').any(|l| l.len() > max) {
        return (std::borrow::Cow::Borrowed(text), Vec::new());
    }
    let mut out = String::new();
    let mut dropped = Vec::new();
    for line in text.split_inclusive('\n') {
        if line.len() > max {
            let id = line.split(' ').next().unwrap_or_default();
            out.push_str(id);
            out.push_str(" -\n");
            dropped.push(id.to_string());
        } else {
            out.push_str(line);
        }
    }
    (std::borrow::Cow::Owned(out), dropped)
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
    fn a_line_too_long_for_a_segment_becomes_its_objects_removal() {
        let text = format!("a/x 1\na/big {}\na/y 2\n", "k".repeat(50));
        let (fit, dropped) = fit_lines(&text, 20);
        assert_eq!(fit, "a/x 1\na/big -\na/y 2\n");
        assert_eq!(dropped, ["a/big"]);
        assert!(matches!(
            fit_lines("a/x 1\n", 20).0,
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn logs_and_sequence_lists_round_trip() {
        let log = Log {
            segments: vec![3, 4, 5, 9, 11, 12],
            bytes: 4096,
            base: 2048,
        };
        assert_eq!(log.format(), "segments=3-5,9,11-12 bytes=4096 base=2048");
        assert_eq!(Log::parse(&log.format()).unwrap(), log);
        assert_eq!(
            Log::parse("segments= bytes=0 base=0").unwrap(),
            Log::default()
        );
        assert!(Log::parse("segments=3-x").is_err());
        assert!(Log::parse("segments=9-3").is_err());
        assert!(Log::parse("size=3").is_err());
    }

    #[test]
    fn small_deltas_wait_in_the_tail_and_larger_ones_become_segments() {
        let mut next = 10;
        let log = Log {
            segments: vec![1],
            bytes: 100_000,
            base: 100_000,
        };
        let p = log.plan("a x\n", "b y\n", || unreachable!(), &mut next, 1000);
        assert!(p.create.is_empty());
        assert_eq!(p.tail, "a x\nb y\n");
        assert_eq!(p.log, log);

        let delta = "c z\n".repeat(TAIL_BYTES / 4);
        let p = log.plan("a x\n", &delta, || unreachable!(), &mut next, 20_000);
        assert_eq!(next, 10 + p.create.len() as u64);
        assert!(!p.create.is_empty());
        assert!(p.create.iter().all(|(_, t)| t.len() <= 20_000));
        let written: String = p.create.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(written, format!("a x\n{delta}"));
        assert_eq!(p.tail, "");
        assert_eq!(p.log.segments[0], 1);
        assert_eq!(p.log.bytes, 100_000 + written.len());
        assert!(p.dropped.is_empty());
    }

    #[test]
    fn the_whole_index_is_rewritten_once_the_segments_since_the_last_rewrite_outweigh_it() {
        let mut next = 20;
        let log = Log {
            segments: vec![1, 2, 7],
            bytes: 370_000,
            base: 200_000,
        };
        // 170,000 written since the base: a 20,000 delta stays under it.
        let p = log.plan(
            "",
            &"d\n".repeat(10_000),
            || unreachable!(),
            &mut next,
            50_000,
        );
        assert_eq!(p.log.segments, [1, 2, 7, 20]);
        // 40,000 passes the base: everything is rewritten.
        let p = log.plan(
            "",
            &"d\n".repeat(20_000),
            || "f\n".repeat(40_000),
            &mut next,
            50_000,
        );
        assert_eq!(p.log.segments, [21, 22]);
        assert_eq!(p.log.bytes, 80_000);
        assert_eq!(p.log.base, 80_000);
        assert_eq!(p.dropped, [1, 2, 7]);
        assert_eq!(p.tail, "");
    }
}
