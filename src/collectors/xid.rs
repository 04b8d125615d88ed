//! The kernel log's [`Counts`] of this boot: XIDs and fallen-off lines by GPU
//! (else unattributed by bus id), SXids by switch, bus id, code and severity.

use crate::collector::{Collector, Hooks, HostError, HostRun};
use crate::kernel_log::{BusId, Counts, Series, XidOf, MAX_SERIES};
use crate::metrics::families;
use crate::snapshot::Snapshot;

families! {
    FAMILIES;
    XID_ERRORS: Counter(Count), "nvidia_gpu_xid_errors_total", [],
        "XID errors the NVIDIA driver logged for this GPU in the kernel log during this boot; 0 until the first.";
    XID_ERRORS_BY_CODE: Counter(Count), "nvidia_gpu_xid_errors_by_code_total", ["code"],
        "XID errors logged for this GPU during this boot, by XID code; a code appears when it is first logged.";
    XID_UNATTRIBUTED: Counter(Count), "nvidia_gpu_xid_unattributed_errors_total", ["pci_bus_id", "code"],
        "XID errors logged during this boot for a PCI bus id that matches no GPU NVML reports, by bus id (domain:bus:device) and code.";
    FALLEN_OFF_BUS: Counter(Count), "nvidia_gpu_fallen_off_bus_total", [],
        "Kernel lines of this boot saying this GPU has fallen off the bus, outside an Xid line (the driver may log one without an Xid 79); 0 until the first.";
    FALLEN_OFF_BUS_UNATTRIBUTED: Counter(Count), "nvidia_gpu_fallen_off_bus_unattributed_total", ["pci_bus_id"],
        "Kernel lines of this boot saying a GPU has fallen off the bus, for a PCI bus id that matches no GPU NVML reports (one that fell off before it enumerated), by bus id (domain:bus:device).";
    NVSWITCH_SXID_ERRORS: Counter(Count), "nvidia_gpu_nvswitch_sxid_errors_total", ["switch", "pci_bus_id", "code", "sxid_severity"],
        "SXid errors the NVSwitch driver logged during this boot, by switch (N of nvidia-nvswitchN), its PCI bus id (domain:bus:device), SXid code and severity (fatal, non_fatal, correctable); a series appears at its first count.";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "xid",
    default: true,
    help: "XID errors, NVSwitch SXids and GPUs fallen off the bus, counted exactly from the kernel log (systemd journal, else /dev/kmsg).",
    families: FAMILIES,
    hooks: Hooks::NONE.with_host_without_nvml(collect),
};

/// Why a run did not count every line.
#[derive(Debug, thiserror::Error)]
pub enum Uncounted {
    #[error("the state cannot be used this run; the XID counts are left out")]
    StateUnusable,
    #[error(
        "{0} kernel line(s) of new XID or SXid series beyond the bound of {MAX_SERIES} \
         series were not counted; the series counted before are kept"
    )]
    Beyond(u64),
}

/// Counts the events logged since the previous run, attributed by the bus ids
/// NVML read, into the snapshot; the counts known are published anyway.
pub fn collect(run: &mut HostRun<'_>) -> Result<(), HostError> {
    if !run.state.continues_totals() {
        // Counts from nothing would publish a reset, then a jump.
        return Err(Uncounted::StateUnusable.into());
    }
    // Whenever totals continue, the state's boot id is this boot's.
    let boot_id = run.state.previous().boot_id.clone();
    let counts = &mut run.state.next().xid;
    // By bus id; a GPU without a UUID or bus id takes no events.
    let devices = run.snapshot.devices.iter().filter(|d| !d.uuid.is_empty());
    let gpus = devices
        .filter_map(|d| Some((BusId::parse(&d.pci_bus_id)?, d.uuid.clone())))
        .collect();
    let journal = run.inputs.journal_dir.as_deref();
    let refused = counts.update(journal, &gpus, &boot_id, run.until);
    add_samples(counts, run.snapshot);
    if let refused @ 1.. = refused? {
        let beyond = Uncounted::Beyond(refused);
        log::warn!("{beyond}");
        return Err(beyond.into());
    }
    Ok(())
}

/// Adds the samples of every GPU with a UUID (down ones too) and the host's;
/// a recount under way is not published.
fn add_samples(counts: &Counts, snapshot: &mut Snapshot) {
    let totals = &counts.totals.0;
    for device in snapshot.devices.iter_mut().filter(|d| !d.uuid.is_empty()) {
        let gpu = XidOf::Gpu(device.uuid.clone());
        let (mut total, samples) = (0, &mut device.samples);
        for (code, n) in totals.iter().filter_map(|(series, &n)| match series {
            Series::Xid { id, code } if *id == gpu => Some((code, n)),
            _ => None,
        }) {
            total += n;
            samples.push(XID_ERRORS_BY_CODE.sample_with([code.to_string()], n as f64));
        }
        samples.push(XID_ERRORS.sample(total as f64));
        let fallen = totals.get(&Series::FallenOffBus { id: gpu }).copied();
        samples.push(FALLEN_OFF_BUS.sample(fallen.unwrap_or(0) as f64));
    }
    for (series, n) in totals.iter().map(|(series, &n)| (series, n as f64)) {
        snapshot.host.push(match series {
            Series::Xid {
                id: XidOf::Bus(bus),
                code,
            } => XID_UNATTRIBUTED.sample_with([bus.clone(), code.to_string()], n),
            Series::FallenOffBus {
                id: XidOf::Bus(bus),
            } => FALLEN_OFF_BUS_UNATTRIBUTED.sample_with([bus.clone()], n),
            Series::Sxid {
                switch,
                pci_bus_id,
                code,
                severity,
            } => {
                let (switch, code) = (switch.to_string(), code.to_string());
                let labels = [switch, pci_bus_id.clone(), code, severity.clone()];
                NVSWITCH_SXID_ERRORS.sample_with(labels, n)
            }
            _ => continue,
        });
    }
}
