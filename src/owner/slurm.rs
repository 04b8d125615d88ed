//! Slurm: a job's processes are in the cgroup slurmstepd made for the job.
//! cgroup v2 `[system.slice/][<node>_]slurmstepd.scope/<job>/…`, the job
//! `job_<id>` or (Slurm 26.05 without `CgroupJobIdPaths=yes`) its SLUID; v1
//! `slurm[_<node>]/uid_<uid>/job_<id>/…`. Slurm keeps these root's (not
//! delegated to the job's user since 23.02), so a job cannot name another;
//! deeper names do not change the job. A SLUID's job number comes from the
//! process's own environment, only where its `SLURM_JOB_SLUID` is that
//! SLUID: a forged one relabels only its own job's series.

use super::manager::{at, Claim, Node};
use crate::procfs::Proc;

label_set! {
    /// A Slurm job by its number, or by its SLUID (the number then from the
    /// job's environment).
    pub struct Job {
        pub job_id: Option<String> => "slurm_job_id",
        pub sluid: Option<String> => "slurm_job_sluid",
    }
}

#[derive(Default)]
pub struct Slurm;

impl Slurm {
    pub fn claim(&self, path: &[&str], process: &Proc, node: &Node) -> Claim<Job> {
        let job = |job_id, sluid| Claim::Owner(Job { job_id, sluid });
        let stepd = usize::from(at(path, 0) == "system.slice");
        if at(path, stepd).ends_with("slurmstepd.scope") {
            let dir = at(path, stepd + 1);
            if let Some(id) = job_number(dir) {
                return job(Some(id), None);
            }
            if !is_sluid(dir) {
                return Claim::User;
            }
            let environ = node.procfs.environ(process.pid);
            return job(environ.and_then(|e| job_id(&e, dir)), Some(dir.to_owned()));
        }
        let v1 = at(path, 0) == "slurm" || at(path, 0).starts_with("slurm_");
        if v1 && at(path, 1).starts_with("uid_") {
            return job_number(at(path, 2)).map_or(Claim::User, |id| job(Some(id), None));
        }
        Claim::Pass
    }
}

/// The number of a `job_<id>` component.
fn job_number(component: &str) -> Option<String> {
    let id = component.strip_prefix("job_")?;
    is_job_number(id).then(|| id.to_owned())
}

/// Whether `text` is a Slurm job's number: decimal digits, at most 20.
pub(crate) fn is_job_number(text: &str) -> bool {
    !text.is_empty() && text.len() <= 20 && text.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `text` is a SLUID as Slurm prints it: `s` and 13 characters of
/// Crockford's base 32 (digits and capitals but I, L, O and U).
pub(crate) fn is_sluid(text: &str) -> bool {
    let crockford = |b: u8| b.is_ascii_digit() || (b.is_ascii_uppercase() && !b"ILOU".contains(&b));
    text.len() == 14 && text.starts_with('s') && text.bytes().skip(1).all(crockford)
}

/// `SLURM_JOB_ID` from an environment whose `SLURM_JOB_SLUID` is `sluid`.
fn job_id(environ: &[u8], sluid: &str) -> Option<String> {
    let var = |name: &[u8]| {
        environ
            .split(|&b| b == 0)
            .find_map(|var| var.strip_prefix(name))
    };
    if var(b"SLURM_JOB_SLUID=")? != sluid.as_bytes() {
        return None;
    }
    let id = String::from_utf8_lossy(var(b"SLURM_JOB_ID=")?);
    is_job_number(&id).then(|| id.into_owned())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{owner_of, root};
    use super::super::Owner;
    use super::*;

    fn job(id: &str) -> Option<Owner> {
        let job_id = Some(id.to_owned());
        Some(Owner::Slurm(Job { job_id, sluid: None }))
    }

    #[test]
    fn a_job_is_read_where_slurmstepd_puts_it() {
        let cases = [
            // cgroup v2 (one and several slurmd per node) and v1.
            ("0::/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0", job("4711")),
            ("0::/system.slice/node7_slurmstepd.scope/job_12/step_batch/user/task_0", job("12")),
            ("12:memory:/slurm/uid_1000/job_99/step_0/task_0\n1:name=systemd:/\n0::/", job("99")),
            ("4:devices:/slurm_node7/uid_1000/job_98/step_0/task_0", job("98")),
            // Deeper names inside a job do not change it.
            ("0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0/job_4711", job("12")),
            // slurmstepd's own cgroups and a letter O in a SLUID: the user's.
            ("0::/system.slice/slurmstepd.scope/system", root()),
            ("0::/system.slice/slurmstepd.scope/sEKNKTV3WPV5O0/step_0", root()),
        ];
        for (cgroup, owner) in cases {
            assert_eq!(owner_of(cgroup, ""), owner, "{cgroup}");
        }
    }

    #[test]
    fn the_job_number_of_a_sluid_comes_from_its_own_environment() {
        let cgroup = "0::/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0";
        let sluid = |job_id: Option<&str>| {
            let (job_id, sluid) = (job_id.map(str::to_owned), Some("sEKNKTV3WPV500".into()));
            Some(Owner::Slurm(Job { job_id, sluid }))
        };
        let environ = "PATH=/bin\0SLURM_JOB_ID_X=1\0SLURM_JOB_ID=4711\0SLURM_JOB_SLUID=sEKNKTV3WPV500\0";
        assert_eq!(owner_of(cgroup, environ), sluid(Some("4711")));
        // Another job's SLUID, none, or a number that is none.
        let other = "SLURM_JOB_ID=4711\0SLURM_JOB_SLUID=sEKNKTV3WPV501\0";
        for environ in [other, "SLURM_JOB_ID=4711\0", "SLURM_JOB_ID=47 11\0SLURM_JOB_SLUID=sEKNKTV3WPV500\0"] {
            assert_eq!(owner_of(cgroup, environ), sluid(None), "{environ}");
        }
    }
}
