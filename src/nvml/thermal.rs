//! Temperatures and fans.

use nvml_wrapper::enum_wrappers::device::TemperatureSensor;

use super::reader::DeviceReader;
use crate::metrics;
use crate::snapshot::Sample;

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    if let Some(celsius) = reader.read("nvmlDeviceGetTemperature", |d| {
        d.temperature(TemperatureSensor::Gpu)
    }) {
        reader.gauge(&metrics::TEMPERATURE, f64::from(celsius));
    }
    let fans = reader
        .read("nvmlDeviceGetNumFans", |d| d.num_fans())
        .unwrap_or(0);
    for fan in 0..fans {
        if let Some(percent) = reader.read("nvmlDeviceGetFanSpeed_v2", |d| d.fan_speed(fan)) {
            reader.push(
                Sample::new(&metrics::FAN_SPEED, f64::from(percent) / 100.0)
                    .with("fan", fan.to_string()),
            );
        }
    }
}
