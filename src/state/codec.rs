//! The state file's text: the schema as JSON (serde), the previous
//! release's format read once, and the bounds a file must keep.

use serde::Deserialize;

use super::problem::Problem;
use super::schema::{
    Damage, GpuState, State, MAX_FIXED, MAX_GPUS, MAX_SIZE, MAX_UNSUPPORTED, VERSION,
};
use super::v1;
use crate::kernel_log::MAX_SERIES;

/// The text of `state`, at most [`MAX_SIZE`] bytes.
pub(super) fn render(state: &State) -> Result<String, Problem> {
    let text = serde_json::to_string(state).map_err(Problem::Encode)? + "\n";
    if text.len() as u64 > MAX_SIZE {
        return Err(Problem::TooLarge(text.len()));
    }
    Ok(text)
}

/// A state file of this version, or of version 1 converted, within the bounds.
pub(super) fn parse(text: &str) -> Result<State, Damage> {
    /// The one field every version has.
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let state = if text.starts_with(v1::MAGIC) {
        v1::parse(text)?
    } else {
        let Version { version } = serde_json::from_str(text).map_err(Damage::NotJson)?;
        if version != VERSION {
            return Err(Damage::Version(version));
        }
        serde_json::from_str(text).map_err(Damage::Schema)?
    };
    within_bounds(state)
}

/// `state` if it holds no more than what is ever stored.
pub(super) fn within_bounds(state: State) -> Result<State, Damage> {
    if state.gpus.len() > MAX_GPUS {
        return Err(Damage::Gpus);
    }
    if let Some((uuid, _)) = state
        .gpus
        .iter()
        .find(|(_, gpu)| gpu.fixed.len() + gpu.fixed_labels.len() > MAX_FIXED)
    {
        return Err(Damage::Fixed(uuid.clone()));
    }
    let too_many = |gpu: &&GpuState| gpu.unsupported.calls.len() > MAX_UNSUPPORTED;
    if let Some((uuid, _)) = state.gpus.iter().find(|(_, gpu)| too_many(gpu)) {
        return Err(Damage::Unsupported(uuid.clone()));
    }
    if let Some((uuid, _)) = state.gpus.iter().find(|(_, gpu)| !gpu.tasks.is_bounded()) {
        return Err(Damage::Tasks(uuid.clone()));
    }
    let recount = state.xid.recount.as_ref().map_or(0, |r| r.0.len());
    if state.xid.totals.0.len().max(recount) > MAX_SERIES {
        return Err(Damage::XidSeries);
    }
    Ok(state)
}
