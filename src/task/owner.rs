//! The task a GPU process works for, most specific first: a Slurm job, a
//! Kubernetes pod's container, a container, a systemd unit, else its user.
//! Only what root wrote counts: cgroup paths are read at the positions the
//! Slurm daemon, the kubelet and systemd create (a user's own delegated
//! subtree, `user.slice`, makes the user the owner), and pod names come from
//! the kubelet's log directories. What the node cannot tell is left out.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Who a task is (the tasks collector makes its label values).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    /// A Slurm job by its number; `sluid` where the node names job cgroups by
    /// their SLUID (Slurm 26.05), the number then from the job's environment.
    Slurm {
        job_id: Option<String>,
        sluid: Option<String>,
    },
    /// A Kubernetes pod by its UID, named where the kubelet's logs name it.
    Pod {
        uid: String,
        namespace: Option<String>,
        name: Option<String>,
        container: Option<String>,
    },
    Container(String),
    Unit(String),
    User(String),
}

/// Where a cgroup path puts a process, before names are looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// A job number (`job_<id>`), or a SLUID (the job's directory itself).
    Slurm(String),
    Pod {
        uid: String,
        container_id: Option<String>,
    },
    Container(String),
    Unit(String),
    /// Nowhere more specific: the process's user owns it.
    User,
}

/// The placement from `/proc/<pid>/cgroup`: the unified (v2) line's path,
/// or where that is the root (v1 or hybrid hierarchies), the first v1 line
/// that says more than [`Placement::User`]. The kernel writes one line per
/// hierarchy, their ids falling (the unified `0` last); a text that does
/// not (a line feed in a name, which kernels before 5.2 take, adding lines
/// of its own: before the real `0::` line where the name is in a v1
/// hierarchy a user was delegated, `name=systemd` in hybrid setups) places
/// nothing.
pub fn placement(cgroup: &str) -> Placement {
    let ids = cgroup.lines().map(|line| {
        line.split_once(':')
            .and_then(|(id, _)| id.parse::<u32>().ok())
    });
    let ids: Option<Vec<u32>> = ids.collect();
    if !ids.is_some_and(|ids| ids.windows(2).all(|w| w[0] > w[1])) {
        return Placement::User;
    }
    let of = |path: &str| {
        of_path(
            &path
                .split('/')
                .filter(|c| !c.is_empty())
                .collect::<Vec<_>>(),
        )
    };
    let unified = cgroup.lines().find_map(|line| line.strip_prefix("0::"));
    if let Some(path) = unified.filter(|path| !path.trim_matches('/').is_empty()) {
        return of(path);
    }
    cgroup
        .lines()
        .filter(|line| !line.starts_with("0::"))
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .map(of)
        .find(|placement| *placement != Placement::User)
        .unwrap_or(Placement::User)
}

/// The placement from a path's components, each read at its fixed position.
fn of_path(c: &[&str]) -> Placement {
    let at = |i: usize| c.get(i).copied().unwrap_or("");
    // cgroup v2: [system.slice/][<node>_]slurmstepd.scope/<job>/…, the job
    // `job_<id>` or its SLUID.
    let stepd = usize::from(at(0) == "system.slice");
    if at(stepd).ends_with("slurmstepd.scope") {
        let job = at(stepd + 1);
        let id = job_number(job).or_else(|| is_sluid(job).then(|| job.to_owned()));
        return id.map_or(Placement::User, Placement::Slurm);
    }
    // cgroup v1: slurm[_<node>]/uid_<uid>/job_<id>/…
    if (at(0) == "slurm" || at(0).starts_with("slurm_")) && at(1).starts_with("uid_") {
        return job_number(at(2)).map_or(Placement::User, Placement::Slurm);
    }
    if at(0) == "kubepods.slice" || at(0) == "kubepods" {
        // The pod is the first or (under a QoS class) the second level below.
        for i in [1, 2] {
            if let Some(uid) = pod_uid(at(i)) {
                let container_id = container_id(at(i + 1));
                return Placement::Pod { uid, container_id };
            }
        }
        return Placement::User;
    }
    if at(0) == "user.slice" {
        return Placement::User;
    }
    // cgroup v1 docker: docker/<id>
    if at(0) == "docker" {
        return container_id(at(1)).map_or(Placement::User, Placement::Container);
    }
    // A unit in a system slice: the slices, then the unit.
    let unit = c.iter().find(|c| !c.ends_with(".slice"));
    match unit {
        Some(unit) if c[0].ends_with(".slice") => match container_id(unit) {
            Some(id) => Placement::Container(id),
            None if unit.ends_with(".service") || unit.ends_with(".scope") => {
                Placement::Unit((*unit).to_owned())
            }
            None => Placement::User,
        },
        _ => Placement::User,
    }
}

/// The number of a `job_<id>` component.
fn job_number(component: &str) -> Option<String> {
    let id = component.strip_prefix("job_")?;
    let digits = !id.is_empty() && id.len() <= 20 && id.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| id.to_owned())
}

/// Whether `text` is a SLUID as Slurm prints it: `s` and 13 characters of
/// Crockford's base 32 (digits and capitals but I, L, O and U).
fn is_sluid(text: &str) -> bool {
    let crockford = |b: u8| b.is_ascii_digit() || (b.is_ascii_uppercase() && !b"ILOU".contains(&b));
    text.len() == 14 && text.starts_with('s') && text.bytes().skip(1).all(crockford)
}

/// The pod UID of `kubepods[-<qos>]-pod<uid>.slice` (systemd driver, `_` for
/// `-`) or `pod<uid>` (cgroupfs driver).
fn pod_uid(component: &str) -> Option<String> {
    let uid = match component.strip_suffix(".slice") {
        Some(stem) => stem.rsplit_once("-pod")?.1.replace('_', "-"),
        None => component.strip_prefix("pod")?.to_owned(),
    };
    is_uid(&uid).then_some(uid)
}

/// Whether `text` is a pod UID as the kubelet writes it: a lower-case UUID
/// (8-4-4-4-12), or a static pod's 32 hex digits (the hash of its manifest).
fn is_uid(text: &str) -> bool {
    let hex = |g: &str| {
        g.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let groups: Vec<&str> = text.split('-').collect();
    let uuid = groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12]);
    (uuid || (text.len() == 32 && groups.len() == 1)) && groups.iter().all(|g| hex(g))
}

/// A container id from `<runtime>-<id>.scope`, or a bare 64-hex-digit id.
pub fn container_id(component: &str) -> Option<String> {
    let id = component.strip_suffix(".scope").map_or(component, |stem| {
        ["docker-", "cri-containerd-", "crio-", "libpod-"]
            .iter()
            .find_map(|prefix| stem.strip_prefix(prefix))
            .unwrap_or("")
    });
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
}

/// `SLURM_JOB_ID` from the environment (`/proc/<pid>/environ`) of a process
/// whose `SLURM_JOB_SLUID` is `sluid` (the job its cgroup places it in).
pub fn slurm_job_id(environ: &[u8], sluid: &str) -> Option<String> {
    let var = |name: &[u8]| {
        environ
            .split(|&b| b == 0)
            .find_map(|var| var.strip_prefix(name))
    };
    if var(b"SLURM_JOB_SLUID=")? != sluid.as_bytes() {
        return None;
    }
    job_number(&format!(
        "job_{}",
        String::from_utf8_lossy(var(b"SLURM_JOB_ID=")?)
    ))
}

/// Pods and containers as the kubelet's log directories name them:
/// `<namespace>_<name>_<uid>` below the pod log directory, and
/// `<pod>_<namespace>_<container>-<container id>.log` below
/// `/var/log/containers` (Kubernetes names hold no `_`).
#[derive(Debug, Default)]
pub struct Pods {
    /// Namespace and name by pod UID.
    pods: HashMap<String, (String, String)>,
    /// Container name by container id.
    containers: HashMap<String, String>,
}

impl Pods {
    /// Reads both directories; one that cannot be read names nothing.
    pub fn read(pod_logs: &Path, container_logs: &Path) -> Pods {
        let names = |dir: &Path| -> Vec<String> {
            let entries = fs::read_dir(dir).into_iter().flatten().flatten();
            entries
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        };
        let mut pods = Pods::default();
        for entry in names(pod_logs) {
            if let [namespace, name, uid] = entry.split('_').collect::<Vec<_>>()[..] {
                if is_uid(uid) && is_name(namespace) && is_name(name) {
                    let names = (namespace.to_owned(), name.to_owned());
                    pods.pods.insert(uid.to_owned(), names);
                }
            }
        }
        for entry in names(container_logs) {
            let Some((stem, id)) = entry.strip_suffix(".log").and_then(|s| s.rsplit_once('-'))
            else {
                continue;
            };
            if let [_, _, container] = stem.split('_').collect::<Vec<_>>()[..] {
                if container_id(id).is_some() && is_name(container) {
                    pods.containers.insert(id.to_owned(), container.to_owned());
                }
            }
        }
        pods
    }

    /// The task of a pod's process.
    pub fn task(&self, uid: String, container_id: Option<&str>) -> Task {
        let (namespace, name) = self.pods.get(&uid).cloned().unzip();
        let container = container_id.and_then(|id| self.containers.get(id).cloned());
        Task::Pod {
            uid,
            namespace,
            name,
            container,
        }
    }
}

/// Whether `text` can be a Kubernetes name (DNS subdomain: lower-case
/// letters, digits, `-` and `.`, at most 253).
fn is_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 253
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// When process `pid` started, µs after boot: field 22 of `/proc/<pid>/stat`,
/// in clock ticks.
pub fn started_us(procfs: &Path, pid: u32) -> Option<u64> {
    let stat = fs::read(procfs.join(pid.to_string()).join("stat")).ok()?;
    // The command name (field 2) may hold anything: fields after its `)`.
    let after = &stat[stat.iter().rposition(|&b| b == b')')? + 1..];
    let ticks: u64 = String::from_utf8_lossy(after)
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    Some(ticks * 1_000_000 / rustix::param::clock_ticks_per_second())
}

/// µs since boot: the clock of process starts, which a step of the wall
/// clock does not move.
pub fn boot_us() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1000
}

/// The real uid from the `Uid:` line of `/proc/<pid>/status`.
pub fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "3f0c8a52-9b1e-4c7d-8e2f-5a6b7c8d9e01";
    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn slurm(id: &str) -> Placement {
        Placement::Slurm(id.to_owned())
    }

    fn pod(container: Option<&str>) -> Placement {
        Placement::Pod {
            uid: UID.to_owned(),
            container_id: container.map(str::to_owned),
        }
    }

    #[test]
    fn every_owner_shape_is_read_where_its_manager_puts_it() {
        let systemd_uid = UID.replace('-', "_");
        let cases = [
            // Slurm, cgroup v2 (one and several slurmd per node) and v1.
            ("0::/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0", slurm("4711")),
            ("0::/system.slice/node7_slurmstepd.scope/job_12/step_batch/user/task_0", slurm("12")),
            ("0::/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0", slurm("sEKNKTV3WPV500")),
            ("0::/system.slice/slurmstepd.scope/sEKNKTV3WPV5O0/step_0", Placement::User),
            ("0::/system.slice/slurmstepd.scope/system", Placement::User),
            ("12:memory:/slurm/uid_1000/job_99/step_0/task_0\n1:name=systemd:/\n0::/", slurm("99")),
            ("4:devices:/slurm_node7/uid_1000/job_98/step_0/task_0", slurm("98")),
            // Pods: systemd driver (QoS class, guaranteed), cgroupfs driver.
            (
                &format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{systemd_uid}.slice/cri-containerd-{ID}.scope"),
                pod(Some(ID)),
            ),
            (&format!("0::/kubepods.slice/kubepods-pod{systemd_uid}.slice/crio-{ID}.scope"), pod(Some(ID))),
            (&format!("0::/kubepods/burstable/pod{UID}/{ID}"), pod(Some(ID))),
            (&format!("0::/kubepods/pod{UID}"), pod(None)),
            // A static pod's UID is its manifest's hash.
            (
                "0::/kubepods.slice/kubepods-podd41d8cd98f00b204e9800998ecf8427e.slice",
                Placement::Pod { uid: "d41d8cd98f00b204e9800998ecf8427e".into(), container_id: None },
            ),
            // Containers, units, users.
            (&format!("0::/system.slice/docker-{ID}.scope"), Placement::Container(ID.into())),
            (&format!("0::/machine.slice/libpod-{ID}.scope/container"), Placement::Container(ID.into())),
            (&format!("9:cpu:/docker/{ID}"), Placement::Container(ID.into())),
            ("0::/system.slice/inference.service", Placement::Unit("inference.service".into())),
            ("0::/system.slice/system-train.slice/train@3.service", Placement::Unit("train@3.service".into())),
            ("0::/user.slice/user-1000.slice/session-4.scope", Placement::User),
            ("0::/init.scope", Placement::User),
            ("", Placement::User),
        ];
        for (cgroup, placement) in cases {
            assert_eq!(super::placement(cgroup), placement, "{cgroup}");
        }
    }

    /// A user may make any cgroup below their own `user@.service` (and
    /// inside a container or job their processes are in): names that look
    /// like a job, pod or container there say nothing.
    #[test]
    fn names_a_user_can_make_place_nothing() {
        let forged = [
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_4711/x".to_owned(),
            format!("0::/user.slice/user-1000.slice/user@1000.service/kubepods.slice/kubepods-pod{UID}.slice"),
            format!("0::/user.slice/user-1000.slice/user@1000.service/app.slice/docker-{ID}.scope"),
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/job_4711".to_owned(),
            "0::/job_4711/step_0".to_owned(),
            format!("0::/pod{UID}"),
        ];
        for cgroup in &forged {
            assert_eq!(placement(cgroup), Placement::User, "{cgroup}");
        }
        // Inside a real job or pod, deeper names do not change it.
        let nested = "0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0/job_4711";
        assert_eq!(placement(nested), slurm("12"));
        // A line feed in a name of the user's cannot add a unified line,
        // nor (hybrid, legacy) lines before the real ones.
        let fed = "0::/user.slice/user-1000.slice/user@1000.service/x\n0::/system.slice/slurmstepd.scope/job_4711/step_0";
        assert_eq!(placement(fed), Placement::User);
        let mine = "/user.slice/user-1000.slice/user@1000.service/x";
        let hybrid =
            format!("1:name=systemd:{mine}\n0::/system.slice/slurmstepd.scope/job_4711\n0::{mine}");
        assert_eq!(placement(&hybrid), Placement::User);
        let legacy = format!("1:name=systemd:{mine}\n1:devices:/slurm/uid_1000/job_99\n0::/");
        assert_eq!(placement(&legacy), Placement::User);
    }

    /// `/proc/<pid>/cgroup` as the kernel writes it, bytes that are no
    /// UTF-8 included, decoded lossily: the manager's components still
    /// place the process, the user's own place nothing.
    #[test]
    fn names_that_are_no_utf8_place_where_their_manager_put_them() {
        let placed = |cgroup: &[u8]| placement(&String::from_utf8_lossy(cgroup));
        let mine = b"0::/user.slice/user-1000.slice/user@1000.service/app.slice";
        for forged in [
            &b"/\xff\xfe.scope"[..],
            b"/slurmstepd.scope/job_4711\xff/step_0",
        ] {
            assert_eq!(placed(&[&mine[..], forged].concat()), Placement::User);
        }
        let unit = placed(b"0::/system.slice/tr\xffain.service\n");
        assert_eq!(unit, Placement::Unit("tr\u{fffd}ain.service".into()));
        let job = placed(b"0::/system.slice/slurmstepd.scope/job_12/step_0/user/\xff");
        assert_eq!(job, slurm("12"));
        // A job number is digits: a replaced byte makes none.
        let broken = placed(b"0::/system.slice/slurmstepd.scope/job_1\xff2/step_0");
        assert_eq!(broken, Placement::User);
    }

    #[test]
    fn the_job_number_comes_from_the_environment_of_its_own_sluid() {
        let sluid = "sEKNKTV3WPV500";
        let environ =
            b"PATH=/bin\0SLURM_JOB_ID_X=1\0SLURM_JOB_ID=4711\0SLURM_JOB_SLUID=sEKNKTV3WPV500\0";
        assert_eq!(slurm_job_id(environ, sluid).as_deref(), Some("4711"));
        // Another job's SLUID, none, or a number that is none.
        assert_eq!(slurm_job_id(environ, "sEKNKTV3WPV501"), None);
        assert_eq!(slurm_job_id(b"SLURM_JOB_ID=4711\0", sluid), None);
        let spaced = b"SLURM_JOB_ID=47 11\0SLURM_JOB_SLUID=sEKNKTV3WPV500\0";
        assert_eq!(slurm_job_id(spaced, sluid), None);
    }

    #[test]
    fn pods_and_containers_are_named_by_the_kubelets_directories() {
        let root = tempfile::tempdir().unwrap();
        let (pods, containers) = (root.path().join("pods"), root.path().join("containers"));
        fs::create_dir_all(pods.join(format!("ml_trainer-0_{UID}"))).unwrap();
        fs::create_dir_all(pods.join("bad_name_with_parts_x")).unwrap();
        fs::create_dir_all(pods.join(format!("Upper_x_{UID}"))).unwrap();
        fs::create_dir_all(&containers).unwrap();
        fs::write(
            containers.join(format!("trainer-0_ml_pytorch-{ID}.log")),
            "",
        )
        .unwrap();
        let pods = Pods::read(&pods, &containers);
        let task = pods.task(UID.to_owned(), Some(ID));
        let expected = Task::Pod {
            uid: UID.to_owned(),
            namespace: Some("ml".into()),
            name: Some("trainer-0".into()),
            container: Some("pytorch".into()),
        };
        assert_eq!(task, expected);
        let other = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
        let unnamed = Task::Pod {
            uid: other.to_owned(),
            namespace: None,
            name: None,
            container: None,
        };
        assert_eq!(pods.task(other.to_owned(), None), unnamed);
        let missing = Pods::read(&root.path().join("none"), &root.path().join("none"));
        assert_eq!(
            missing.task(UID.to_owned(), Some(ID)),
            Task::Pod {
                uid: UID.into(),
                namespace: None,
                name: None,
                container: None
            }
        );
    }

    #[test]
    fn a_start_time_is_read_past_any_command_name() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("42")).unwrap();
        // Field 22 is 250 ticks (2.5 s at 100 per second) after boot.
        let stat = "42 (a) b) c) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 250 1000 10";
        fs::write(root.path().join("42/stat"), stat).unwrap();
        let per_second = rustix::param::clock_ticks_per_second();
        let expected = 250 * 1_000_000 / per_second;
        assert_eq!(started_us(root.path(), 42), Some(expected));
        assert_eq!(started_us(root.path(), 43), None);
    }
}
