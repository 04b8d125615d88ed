//! The Prometheus text exposition format 0.0.4, parsed strictly: the Rust
//! tests' one parser, independent of the exporter's `render` (the code under
//! test must not check itself). The Python scripts have theirs,
//! tests/lib/exposition.py, with the same rules.
//!
//! [`parse`] returns every series with its value, or an error naming the line when:
//! - the text is empty or does not end with a line feed (a truncated file);
//! - a comment is not `# HELP name text` or `# TYPE name type`, a type is unknown,
//!   HELP or TYPE comes twice for a name, or after the name's samples;
//! - HELP text has an escape other than `\\` and `\n`;
//! - a name is invalid, a label is repeated, a label value has an escape other
//!   than `\\`, `\"`, `\n`, or is unterminated;
//! - a value is not a float, `NaN`, `+Inf` or `-Inf`, or a timestamp follows it;
//! - a family's lines are not contiguous, or a series repeats.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

/// A metric name and its labels, sorted by label name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Series {
    pub name: String,
    pub labels: Vec<(String, String)>,
}

pub type Samples = BTreeMap<Series, f64>;

impl Series {
    pub fn new(name: &str, labels: &[(&str, &str)]) -> Series {
        let mut labels: Vec<_> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        labels.sort();
        Series {
            name: name.to_string(),
            labels,
        }
    }

    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether every pair of `labels` is among this series' labels.
    pub fn has(&self, labels: &[(&str, &str)]) -> bool {
        labels.iter().all(|(k, v)| self.label(k) == Some(v))
    }

    pub fn without(&self, names: &[&str]) -> Series {
        let labels = self
            .labels
            .iter()
            .filter(|(k, _)| !names.contains(&k.as_str()))
            .cloned();
        Series {
            name: self.name.clone(),
            labels: labels.collect(),
        }
    }
}

impl fmt::Display for Series {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if self.labels.is_empty() {
            return Ok(());
        }
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", v.chars().take(40).collect::<String>()))
            .collect();
        write!(f, "{{{}}}", labels.join(","))
    }
}

const TYPES: [&str; 5] = ["counter", "gauge", "histogram", "summary", "untyped"];

/// The length of the longest name at the start of `s`.
fn name_len(s: &str, colon: bool) -> usize {
    let end = s
        .char_indices()
        .find(|&(i, c)| {
            !(c.is_ascii_alphabetic()
                || c == '_'
                || (colon && c == ':')
                || (i > 0 && c.is_ascii_digit()))
        })
        .map_or(s.len(), |(i, _)| i);
    end
}

fn unescape(text: &str, allowed: &[char]) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some(n) if allowed.contains(&n) => out.push(if n == 'n' { '\n' } else { n }),
            n => {
                return Err(format!(
                    "bad escape \\{}",
                    n.map(String::from).unwrap_or_default()
                ))
            }
        }
    }
    Ok(out)
}

/// `[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?`, `NaN`, `+Inf` or `-Inf`.
fn number(text: &str) -> Option<f64> {
    match text {
        "NaN" => return Some(f64::NAN),
        "+Inf" => return Some(f64::INFINITY),
        "-Inf" => return Some(f64::NEG_INFINITY),
        _ => {}
    }
    let b = text.as_bytes();
    let digits = |i: usize| b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
    let mut i = usize::from(matches!(b.first(), Some(b'+' | b'-')));
    let int = digits(i);
    i += int;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let frac = digits(i);
        if int == 0 && frac == 0 {
            return None;
        }
        i += frac;
    } else if int == 0 {
        return None;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1 + usize::from(matches!(b.get(i + 1), Some(b'+' | b'-')));
        let exp = digits(i);
        if exp == 0 {
            return None;
        }
        i += exp;
    }
    (i == b.len()).then(|| text.parse().ok()).flatten()
}

fn sample(line: &str) -> Result<(Series, f64), String> {
    let n = name_len(line, true);
    if n == 0 {
        return Err("no metric name".into());
    }
    let name = &line[..n];
    let mut rest = &line[n..];
    let mut labels: Vec<(String, String)> = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        while !rest.starts_with('}') {
            let column = line.len() - rest.len() + 1;
            let l = name_len(rest, false);
            let label = &rest[..l];
            if l == 0 || !rest[l..].starts_with("=\"") {
                return Err(format!("bad label at column {column}"));
            }
            rest = &rest[l + 2..];
            // The value runs to the first quote that is not escaped.
            let mut end = None;
            let mut escaped = false;
            for (i, c) in rest.char_indices() {
                match (escaped, c) {
                    (false, '\\') => escaped = true,
                    (false, '"') => {
                        end = Some(i);
                        break;
                    }
                    _ => escaped = false,
                }
            }
            let end = end.ok_or_else(|| format!("unterminated value of label {label}"))?;
            if labels.iter().any(|(k, _)| k == label) {
                return Err(format!("label {label} twice"));
            }
            labels.push((
                label.to_string(),
                unescape(&rest[..end], &['\\', '"', 'n'])?,
            ));
            rest = &rest[end + 1..];
            if let Some(r) = rest.strip_prefix(',') {
                rest = r;
            } else if !rest.starts_with('}') {
                return Err(format!("expected , or }} after label {label}"));
            }
        }
        rest = &rest[1..];
    }
    let v = rest.strip_prefix(' ').and_then(number);
    let v = v.ok_or_else(|| format!("bad value {rest:?} (or a timestamp)"))?;
    labels.sort();
    Ok((
        Series {
            name: name.to_string(),
            labels,
        },
        v,
    ))
}

/// A family's `# TYPE` and `# HELP` (unescaped), where the text gave them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Family {
    pub kind: Option<String>,
    pub help: Option<String>,
}

/// A whole file: its samples and its families' metadata, by family name.
#[derive(Clone, Debug, Default)]
pub struct Exposition {
    pub samples: Samples,
    pub families: BTreeMap<String, Family>,
}

/// Every series of `text` with its value.
pub fn parse(text: &str) -> Result<Samples, String> {
    parse_all(text).map(|e| e.samples)
}

/// [`parse`], also returning each family's TYPE and HELP.
pub fn parse_all(text: &str) -> Result<Exposition, String> {
    if text.is_empty() {
        return Err("empty".into());
    }
    let body = text
        .strip_suffix('\n')
        .ok_or("does not end with a line feed (truncated?)")?;
    let mut samples = Samples::new();
    // name -> [TYPE, HELP]
    let mut meta: HashMap<String, [Option<String>; 2]> = HashMap::new();
    let (mut done, mut sampled) = (HashSet::new(), HashSet::new());
    let mut current: Option<String> = None;
    for (number, line) in body.split('\n').enumerate() {
        let mut step = || -> Result<(), String> {
            let family = if line.starts_with('#') {
                let (kind, rest) = line
                    .strip_prefix("# TYPE ")
                    .map(|r| ("TYPE", r))
                    .or_else(|| line.strip_prefix("# HELP ").map(|r| ("HELP", r)))
                    .ok_or("comment is not HELP or TYPE")?;
                let n = name_len(rest, true);
                let (name, text) = (&rest[..n], &rest[n..]);
                let text = if text.is_empty() {
                    Some("")
                } else {
                    text.strip_prefix(' ')
                };
                let text = text
                    .filter(|_| n > 0)
                    .ok_or("comment is not HELP or TYPE")?;
                let slot = usize::from(kind == "HELP");
                let entry = meta.entry(name.to_string()).or_default();
                if entry[slot].is_some() {
                    return Err(format!("second {kind} for {name}"));
                }
                if kind == "TYPE" && !TYPES.contains(&text) {
                    return Err(format!("TYPE {text:?} unknown"));
                }
                if sampled.contains(name) {
                    return Err(format!("{kind} after samples of {name}"));
                }
                entry[slot] = Some(if kind == "TYPE" {
                    text.to_string()
                } else {
                    unescape(text, &['\\', 'n'])?
                });
                name.to_string()
            } else {
                let (series, v) = sample(line)?;
                let family = family_of(&series.name, &meta);
                if samples.insert(series, v).is_some() {
                    return Err("duplicate series".into());
                }
                sampled.insert(family.clone());
                family
            };
            if current.as_ref() != Some(&family) {
                if done.contains(&family) {
                    return Err(format!("lines of {family} are not contiguous"));
                }
                if let Some(previous) = current.replace(family) {
                    done.insert(previous);
                }
            }
            Ok(())
        };
        step().map_err(|e| {
            format!(
                "line {}: {e}: {:?}",
                number + 1,
                line.chars().take(160).collect::<String>()
            )
        })?;
    }
    let families = meta
        .into_iter()
        .map(|(name, [kind, help])| (name, Family { kind, help }))
        .collect();
    Ok(Exposition { samples, families })
}

/// [`parse_all`] of bytes that must be UTF-8.
pub fn parse_all_bytes(data: &[u8]) -> Result<Exposition, String> {
    parse_all(std::str::from_utf8(data).map_err(|e| format!("not UTF-8: {e}"))?)
}

/// The series `text` names as the text format writes it (`name` or
/// `name{label="value",...}`), parsed by the same rules as a file's.
pub fn series(text: &str) -> Result<Series, String> {
    sample(&format!("{text} 0"))
        .map(|(series, _)| series)
        .map_err(|e| format!("{text}: {e}"))
}

/// The samples of family `name` whose labels include every pair of `labels`.
pub fn select<'s>(
    samples: &'s Samples,
    name: &str,
    labels: &[(&str, &str)],
) -> Vec<(&'s Series, f64)> {
    samples
        .iter()
        .filter(|(s, _)| s.name == name && s.has(labels))
        .map(|(s, v)| (s, *v))
        .collect()
}

/// The value of the one sample [`select`] finds; `None` when there is none.
///
/// # Panics
/// When more than one sample matches: the caller's labels do not name one series.
pub fn value(samples: &Samples, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let found = select(samples, name, labels);
    assert!(
        found.len() <= 1,
        "{name} {labels:?} matches {} series",
        found.len()
    );
    found.first().map(|(_, v)| *v)
}

/// The value of exactly the series `series`, written as the text format
/// writes it (`name` or `name{label="value",...}`, labels in any order);
/// `None` when `samples` has no such series.
///
/// # Panics
/// When `series` is not a series.
pub fn lookup(samples: &Samples, series: &str) -> Option<f64> {
    let key = self::series(series).unwrap_or_else(|e| panic!("{e}"));
    samples.get(&key).copied()
}

/// The samples of `text`, a complete file.
///
/// # Panics
/// When it does not parse (the message has the text).
pub fn parsed(text: &str) -> Samples {
    parse(text).unwrap_or_else(|e| panic!("{e}:\n{text}"))
}

/// [`value`] in the file `text` ([`parsed`]).
pub fn value_in(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    value(&parsed(text), name, labels)
}

/// [`value`] of the series `name` of GPU `gpu` with `labels`.
pub fn gpu_value(samples: &Samples, name: &str, gpu: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut all = vec![("gpu", gpu)];
    all.extend_from_slice(labels);
    value(samples, name, &all)
}

/// Whether any sample's name starts with `prefix`.
pub fn any_named(samples: &Samples, prefix: &str) -> bool {
    samples.keys().any(|s| s.name.starts_with(prefix))
}

/// The family a sample belongs to: `x_sum` of a summary `x` is `x`.
fn family_of(name: &str, meta: &HashMap<String, [Option<String>; 2]>) -> String {
    let suffixes = [
        ("histogram", &["_bucket", "_sum", "_count"][..]),
        ("summary", &["_sum", "_count"][..]),
    ];
    for (kind, list) in suffixes {
        for suffix in list {
            if let Some(base) = name.strip_suffix(suffix) {
                if meta.get(base).and_then(|m| m[0].as_deref()) == Some(kind) {
                    return base.to_string();
                }
            }
        }
    }
    name.to_string()
}

/// [`parse`] of bytes that must be UTF-8.
pub fn parse_bytes(data: &[u8]) -> Result<Samples, String> {
    parse(std::str::from_utf8(data).map_err(|e| format!("not UTF-8: {e}"))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_is_named_as_a_file_writes_it() {
        let want = Series::new("a", &[("a", "2"), ("b", "q\"")]);
        assert_eq!(series(r#"a{b="q\"",a="2"}"#), Ok(want));
        assert_eq!(series("a"), Ok(Series::new("a", &[])));
        for bad in ["a 1", "a{b=1}", "1a", ""] {
            assert!(series(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_labels_escapes_and_special_values() {
        let text = "# HELP a_total x \\\\ y\\n\n# TYPE a_total counter\n\
                    a_total{b=\"q\\\"\\\\\\n\",a=\"}\"} 1.5e3\nb NaN\nc{} -Inf\n";
        let s = parse(text).unwrap();
        let key = Series::new("a_total", &[("a", "}"), ("b", "q\"\\\n")]);
        assert_eq!(s[&key], 1500.0);
        assert!(s[&Series::new("b", &[])].is_nan());
        assert_eq!(s[&Series::new("c", &[])], f64::NEG_INFINITY);
        assert!(name_len("a:b_1", true) == 5 && name_len("1a", true) == 0);
    }

    /// Label values that look like the format's own syntax stay inside their
    /// label: commas, quotes, braces, `=`, escaped line feeds and backslashes,
    /// a value that spells another series.
    #[test]
    fn hostile_label_values_round_trip() {
        let text = concat!(
            "# HELP g_info a \"quoted\" help, with \\\\ and\\nlines\n",
            "# TYPE g_info gauge\n",
            r#"g_info{a="x,y=\"z\"",b="}} 1\nforged{gpu=\"9\"} 2",c="\\",d="\\\"",e="",f="é显 #"} 1"#,
            "\n",
            r#"g_info{a="\\n",b="",c="",d="",e=",",f="{"} NaN"#,
            "\n# TYPE v gauge\nv{x=\"1\"} +Inf\nv{x=\"2\"} -Inf\nv{x=\"3\"} -0.5e-3\n",
        );
        let e = parse_all(text).unwrap();
        let first = Series::new(
            "g_info",
            &[
                ("a", "x,y=\"z\""),
                ("b", "}} 1\nforged{gpu=\"9\"} 2"),
                ("c", "\\"),
                ("d", "\\\""),
                ("e", ""),
                ("f", "é显 #"),
            ],
        );
        assert_eq!(e.samples[&first], 1.0);
        let second = Series::new(
            "g_info",
            &[
                ("a", "\\n"),
                ("b", ""),
                ("c", ""),
                ("d", ""),
                ("e", ","),
                ("f", "{"),
            ],
        );
        assert!(e.samples[&second].is_nan());
        assert_eq!(e.samples.len(), 5, "{:?}", e.samples.keys());
        assert!(!e.samples.keys().any(|s| s.name == "forged"));
        assert_eq!(
            e.families["g_info"],
            Family {
                kind: Some("gauge".into()),
                help: Some("a \"quoted\" help, with \\ and\nlines".into()),
            }
        );
        assert_eq!(value(&e.samples, "v", &[("x", "1")]), Some(f64::INFINITY));
        assert_eq!(
            value(&e.samples, "v", &[("x", "2")]),
            Some(f64::NEG_INFINITY)
        );
        assert_eq!(value(&e.samples, "v", &[("x", "3")]), Some(-0.0005));
        assert_eq!(value(&e.samples, "v", &[("x", "4")]), None);
        assert_eq!(select(&e.samples, "v", &[]).len(), 3);
        assert_eq!(lookup(&e.samples, r#"v{x="3"}"#), Some(-0.0005));
        assert_eq!(lookup(&e.samples, "v"), None);
        assert!(any_named(&e.samples, "g_") && !any_named(&e.samples, "forged"));
    }

    #[test]
    fn summary_samples_belong_to_their_family() {
        let text = "# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 2\ns_count 3\nt 1\n";
        assert_eq!(parse(text).unwrap().len(), 4);
    }

    #[test]
    fn rejects_what_is_not_a_complete_file() {
        for (text, why) in [
            ("", "empty"),
            ("a 1", "line feed"),
            ("a 1\nb 2\na{x=\"1\"} 3\n", "not contiguous"),
            ("a 1\na 2\n", "duplicate"),
            ("a 1 1700000000\n", "bad value"),
            ("a{x=\"\\t\"} 1\n", "bad escape"),
            ("a{x=\"1\",x=\"2\"} 1\n", "twice"),
            ("a{x=\"1} 1\n", "unterminated"),
            ("a{x=\"1\"\n", "expected , or }"),
            ("a Inf\n", "bad value"),
            ("a .\n", "bad value"),
            ("a 1e\n", "bad value"),
            ("# comment\n", "not HELP or TYPE"),
            ("# TYPE a gauge\n# TYPE a gauge\na 1\n", "second TYPE"),
            ("a 1\n# TYPE a gauge\n", "after samples"),
            ("a 1\n# HELP a late\n", "after samples"),
            ("# HELP a x\n# HELP a y\na 1\n", "second HELP"),
            ("a{x=\"1\"} 1\r\n", "bad value"),
            ("a{x=\"a\"b\"} 1\n", "expected , or }"),
            ("a{x=\"a\\\"} 1\n", "unterminated"),
            ("a 1\n\n", "no metric name"),
            ("a  1\n", "bad value"),
            ("# TYPE a gaug\n", "unknown"),
            ("# HELP a \\t\n", "bad escape"),
            ("9a 1\n", "no metric name"),
            ("a{9=\"1\"} 1\n", "bad label"),
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }
}
