//! `--generate`: documentation and data printed by the binary from the same
//! definitions it runs on, so that the man page, the tests and the packaging
//! never copy a list by hand.

use std::io::{self, Write};

use clap::CommandFactory;
use clap_mangen::roff::{bold, roman, Roff};

use crate::cli::{Cli, Generate};
use crate::collectors as registry;
use crate::exit::Exit;
use crate::reason::Reason;

pub fn generate(what: Generate, out: &mut dyn Write) -> io::Result<()> {
    match what {
        Generate::Man => man_page(out),
        Generate::Families => registry::families().try_for_each(|family| {
            let (kind, labels) = (family.kind.as_str(), family.labels.join(","));
            writeln!(out, "{}\t{kind}\t{labels}\t{}", family.name, family.help)
        }),
        Generate::Collectors => registry::ALL.iter().try_for_each(|collector| {
            let families: Vec<&str> = collector.families.iter().map(|f| f.name).collect();
            let default = if collector.default { "on" } else { "off" };
            let (name, help) = (collector.name, collector.help);
            writeln!(out, "{name}\t{default}\t{}\t{help}", families.join(","))
        }),
        Generate::ExitCodes => Exit::ALL.iter().try_for_each(|exit| {
            writeln!(out, "{}\t{}\t{}", exit.code(), exit.name(), exit.meaning())
        }),
        Generate::Reasons => Reason::ALL
            .iter()
            .try_for_each(|reason| writeln!(out, "{}\t{}", reason.label(), reason.hint())),
    }
}

/// The man page: clap's sections, then those a Debian user expects; no date.
fn man_page(out: &mut dyn Write) -> io::Result<()> {
    let man = clap_mangen::Man::new(Cli::command())
        .section("1")
        .manual("User Commands");
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;

    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    for exit in Exit::ALL {
        roff.control("TP", []);
        roff.text([bold(exit.code().to_string())]);
        roff.text([roman(format!("{}.", exit.meaning()))]);
    }
    roff.control("SH", ["DIAGNOSTICS"]);
    roff.text([roman(
        "A run that fails writes nvidia_gpu_collector_up 0 and \
         nvidia_gpu_collector_error{reason}; a GPU that is down, nvidia_gpu_up 0 and \
         nvidia_gpu_down_reason{reason}. Standard error (the journal, for the timer's \
         runs) names the reason, then what to check:",
    )]);
    for reason in Reason::ALL {
        roff.control("TP", []);
        roff.text([bold(reason.label())]);
        roff.text([roman(reason.hint())]);
    }
    roff.control("SH", ["ENVIRONMENT"]);
    roff.control("TP", []);
    roff.text([bold("RUST_LOG")]);
    roff.text([roman(
        "Log level on standard error: error, warn (the default; a healthy run prints \
         nothing), info, debug (every unsupported field) or trace (every NVML call's time).",
    )]);
    roff.control("TP", []);
    roff.text([bold("JOURNAL_STREAM")]);
    roff.text([roman(
        "Set by systemd when standard error is the journal; each line then carries its \
         priority.",
    )]);
    roff.control("SH", ["FILES"]);
    for (path, what) in [
        (
            "/etc/default/nvidia-textfile-exporter",
            "Options for the systemd service (ARGS=, RUST_LOG=).",
        ),
        (
            "/var/lib/prometheus/node-exporter/nvidia_gpu.prom",
            "The output file; a hidden .nvidia_gpu.prom.lock beside it serialises runs.",
        ),
        (
            "/usr/share/nvidia-textfile-exporter/",
            "Prometheus alert rules and a Grafana dashboard for these metrics.",
        ),
    ] {
        roff.control("TP", []);
        roff.text([bold(path)]);
        roff.text([roman(what)]);
    }
    roff.control("SH", ["SEE ALSO"]);
    roff.text([
        bold("prometheus-node-exporter"),
        roman("(1), "),
        bold("nvidia-smi"),
        roman("(1), "),
        bold("systemd.timer"),
        roman("(5), "),
        bold("nvidia-textfile-exporter.timer"),
        roman(
            ", /usr/share/doc/nvidia-textfile-exporter/README.md.gz and, beside it, docs/ \
             (metrics, failures, XID runbook, alerts, operations, design)",
        ),
    ]);
    roff.to_writer(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(what: Generate) -> String {
        let mut out = Vec::new();
        generate(what, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn man_page_has_the_sections_a_debian_user_expects() {
        let page = text(Generate::Man);
        for section in [
            "NAME",
            "SYNOPSIS",
            "DESCRIPTION",
            "OPTIONS",
            "\"EXIT STATUS\"",
            "DIAGNOSTICS",
            "ENVIRONMENT",
            "FILES",
            "\"SEE ALSO\"",
        ] {
            assert!(page.contains(&format!(".SH {section}\n")), "no {section}");
        }
        for exit in Exit::ALL {
            let entry = format!(".TP\n\\fB{}\\fR\n", exit.code());
            assert!(page.contains(&entry), "{exit:?} missing under EXIT STATUS");
        }
        for reason in Reason::ALL {
            let entry = format!(".TP\n\\fB{}\\fR\n", reason.label());
            assert!(
                page.contains(&entry),
                "{reason:?} missing under DIAGNOSTICS"
            );
        }
        assert!(
            !page.contains("EXTRA"),
            "exit statuses belong under EXIT STATUS"
        );
    }

    #[test]
    fn data_tables_have_one_line_per_row() {
        assert_eq!(
            text(Generate::Families).lines().count(),
            registry::families().count()
        );
        assert_eq!(
            text(Generate::Collectors).lines().count(),
            registry::ALL.len()
        );
        assert_eq!(text(Generate::ExitCodes).lines().count(), Exit::ALL.len());
        assert_eq!(text(Generate::Reasons).lines().count(), Reason::ALL.len());
        for line in text(Generate::Families).lines() {
            assert_eq!(line.split('\t').count(), 4, "{line}");
        }
    }
}
