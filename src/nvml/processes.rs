//! Per-process GPU memory. Only the pid is known here; `procfs` adds the owner.

use nvml_wrapper::enums::device::UsedGpuMemory;

use super::reader::DeviceReader;
use crate::metrics;
use crate::snapshot::Sample;

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    let Some(processes) = reader.read("nvmlDeviceGetComputeRunningProcesses_v3", |d| {
        d.running_compute_processes()
    }) else {
        return;
    };
    for process in processes {
        // NVML cannot always tell (no permission, some MIG setups): such a process
        // is still counted in nvidia_gpu_processes but has no memory reading.
        let UsedGpuMemory::Used(bytes) = process.used_gpu_memory else {
            continue;
        };
        let mut sample = Sample::new(&metrics::PROCESS_MEMORY_USED, bytes as f64)
            .with("pid", process.pid.to_string());
        if let Some(id) = process.gpu_instance_id {
            sample = sample.with("gpu_instance_id", id.to_string());
        }
        if let Some(id) = process.compute_instance_id {
            sample = sample.with("compute_instance_id", id.to_string());
        }
        reader.push(sample);
    }
}
