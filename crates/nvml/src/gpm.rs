//! GPU Performance Monitoring: samples of the GPU or of one of its GPU
//! instances, and the metrics between two samples.

use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::gpm::gpm_metrics_get;
use nvml_wrapper::GpmSample;

use super::{DeviceReader, Error};

impl<'n> DeviceReader<'n> {
    /// Without the error policy (some errors say why GPM is unavailable).
    pub fn gpm_sample(&mut self, instance: Option<u32>) -> Option<Result<GpmSample<'n>, Error>> {
        let (call, answer) = match instance {
            None => (
                "nvmlGpmSampleGet",
                self.attempt("nvmlGpmSampleGet", |d| d.gpm_sample()),
            ),
            Some(gi) => {
                let call = "nvmlGpmMigSampleGet";
                (call, self.attempt(call, |d| d.gpm_mig_sample(gi)))
            }
        };
        Some(answer?.map_err(|e| Error::new(call, e)))
    }

    /// Each `None` where NVML does not give it (counted unless not
    /// supported); `None` when the call failed.
    pub fn gpm_metrics(
        &mut self,
        first: &GpmSample<'n>,
        second: &GpmSample<'n>,
        ids: &[GpmMetricId],
    ) -> Option<Vec<Option<f64>>> {
        const CALL: &str = "nvmlGpmMetricsGet";
        let results = self.read_by(CALL, |d| gpm_metrics_get(d.nvml(), first, second, ids))?;
        let mut note = |error| self.note(&Error::new(CALL, error));
        let values = results.into_iter().map(|r| r.map_err(&mut note).ok());
        Some(values.map(|metric| Some(metric?.value)).collect())
    }
}
