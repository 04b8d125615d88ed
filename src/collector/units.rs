//! The units NVML reads in, and the clock domains' labels.

use nvml::types::Clock;

pub const CLOCK_DOMAINS: [(Clock, &str); 4] = [
    (Clock::Graphics, "graphics"),
    (Clock::SM, "sm"),
    (Clock::Memory, "memory"),
    (Clock::Video, "video"),
];

pub fn flag(on: bool) -> f64 {
    f64::from(u8::from(on))
}

pub const HERTZ_PER_MEGAHERTZ: f64 = 1e6;

/// NVML reads power in milliwatts and energy in millijoules.
pub const PER_MILLI: f64 = 1000.0;
