//! Clock frequencies and the performance state.

use nvml_wrapper::enum_wrappers::device::{Clock, PerformanceState};

use super::reader::DeviceReader;
use crate::metrics;
use crate::snapshot::Sample;

/// The clock domains read, with their `clock` label values.
const DOMAINS: [(Clock, &str); 4] = [
    (Clock::Graphics, "graphics"),
    (Clock::SM, "sm"),
    (Clock::Memory, "memory"),
    (Clock::Video, "video"),
];

const HERTZ_PER_MEGAHERTZ: f64 = 1e6;

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    for (clock, label) in DOMAINS {
        if let Some(mhz) = reader.read("nvmlDeviceGetClockInfo", |d| d.clock_info(clock)) {
            reader.push(
                Sample::new(&metrics::CLOCK, f64::from(mhz) * HERTZ_PER_MEGAHERTZ)
                    .with("clock", label),
            );
        }
    }
    if let Some(state) = reader.read("nvmlDeviceGetPerformanceState", |d| d.performance_state()) {
        if let Some(number) = pstate_number(state) {
            reader.gauge(&metrics::PERFORMANCE_STATE, f64::from(number));
        }
    }
}

/// P0..P15 as 0..15; NVML's "unknown" state is not a number and is left out.
fn pstate_number(state: PerformanceState) -> Option<u8> {
    use PerformanceState::*;
    Some(match state {
        Zero => 0,
        One => 1,
        Two => 2,
        Three => 3,
        Four => 4,
        Five => 5,
        Six => 6,
        Seven => 7,
        Eight => 8,
        Nine => 9,
        Ten => 10,
        Eleven => 11,
        Twelve => 12,
        Thirteen => 13,
        Fourteen => 14,
        Fifteen => 15,
        Unknown => return None,
    })
}
