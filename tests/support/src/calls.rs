//! The fake NVML's call log (`FAKE_NVML_CALL_LOG`, tests/fake-nvml/README.md):
//! which NVML functions a run called, on which device, how often, and which
//! fields its `nvmlDeviceGetFieldValues` calls asked.

use std::path::Path;

/// One run's calls, in the order they were made: function, device and what
/// it was asked (the fields of `nvmlDeviceGetFieldValues`, else empty).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Calls(pub Vec<(String, String, String)>);

impl Calls {
    /// The log at `path`; empty when the run wrote none.
    ///
    /// # Panics
    /// When a line is not `function device[ asked]`.
    pub fn read(path: &Path) -> Calls {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        Calls(
            text.lines()
                .map(|line| {
                    let (call, rest) = line
                        .split_once(' ')
                        .unwrap_or_else(|| panic!("call log line {line:?}"));
                    let (device, asked) = rest.split_once(' ').unwrap_or((rest, ""));
                    (call.to_owned(), device.to_owned(), asked.to_owned())
                })
                .collect(),
        )
    }

    /// How often `call` was made on `device` (`"-"`, `"0"`, `"0/1"`).
    pub fn count(&self, call: &str, device: &str) -> usize {
        self.0
            .iter()
            .filter(|(c, d, _)| c == call && d == device)
            .count()
    }

    /// How often `call` was made, on any device.
    pub fn total(&self, call: &str) -> usize {
        self.0.iter().filter(|(c, _, _)| c == call).count()
    }

    /// The fields each `nvmlDeviceGetFieldValues` call on `device` asked, in
    /// order, as `fieldId:scopeId`.
    pub fn field_batches(&self, device: &str) -> Vec<Vec<&str>> {
        self.0
            .iter()
            .filter(|(c, d, _)| c == "nvmlDeviceGetFieldValues" && d == device)
            .map(|(_, _, asked)| asked.split(',').filter(|f| !f.is_empty()).collect())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_is_counted_by_call_and_device() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("calls");
        let log = "nvmlDeviceGetCount_v2 -\na 0\na 1\na 0\nb 0/1\n\
                   nvmlDeviceGetFieldValues 1 82:0,91:0\nnvmlDeviceGetFieldValues 1 165:2\n";
        std::fs::write(&path, log).unwrap();
        let calls = Calls::read(&path);
        assert_eq!((calls.count("a", "0"), calls.count("a", "1")), (2, 1));
        assert_eq!((calls.total("a"), calls.count("b", "0/1")), (3, 1));
        assert_eq!(calls.count("nvmlDeviceGetCount_v2", "-"), 1);
        assert_eq!(calls.count("nvmlDeviceGetFieldValues", "1"), 2);
        let batches = calls.field_batches("1");
        assert_eq!(batches, [vec!["82:0", "91:0"], vec!["165:2"]]);
        assert!(calls.field_batches("0").is_empty());
        assert_eq!(Calls::read(&dir.path().join("none")), Calls::default());
    }
}
