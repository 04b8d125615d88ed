//! The source's layering, checked on the paths each file imports or names
//! (`use` trees expanded, main.rs included): no two files import each other
//! in a cycle (directly or through others), no collector imports another,
//! code outside `src/collectors/` imports only their registry and never names
//! a collector, and `snapshot` and `render` touch neither NVML nor the file
//! system. What the crate graph says is the compiler's: the NVML layer is a
//! crate of its own that depends on nothing of the exporter, and only it
//! depends on nvml-wrapper.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file (`collectors::gpm`; `""` for lib.rs, `main`
/// for main.rs).
fn module_of(file: &Path) -> String {
    if file.ends_with("main.rs") {
        return "main".to_owned();
    }
    let relative = file.strip_prefix(SRC).unwrap().with_extension("");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts.join("::")
}

/// A file's code without its `#[cfg(test)]` module (tests may use anything)
/// and without comments (a doc link is not an import).
fn product_text(file: &Path) -> String {
    let text = fs::read_to_string(file).unwrap();
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text,
    };
    code.lines()
        .map(|line| match line.trim_start().starts_with("//") {
            true => "",
            false => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths `text` names: each `use` tree expanded (`use a::{self, b::c as
/// d}` names `a` and `a::b::c`), then every other `a::b` path in the code.
fn paths_in(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut code = String::new();
    let mut rest = text;
    while let Some(at) = find_use(rest) {
        code.push_str(&rest[..at]);
        let end = at + rest[at..].find(';').expect("a use item ends with ;");
        let tree: String = rest[at + "use ".len()..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        expand("", &tree, &mut paths);
        rest = &rest[end + 1..];
    }
    code.push_str(rest);
    paths.extend(
        code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .filter(|w| w.contains("::"))
            .map(|w| w.trim_start_matches("::").trim_end_matches("::").to_owned()),
    );
    paths
}

/// Where the next `use` item of `text` starts: a line (formatted code) that
/// begins with `use`, or `pub use`, `pub(crate) use`, ...
fn find_use(text: &str) -> Option<usize> {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let code = line.trim_start();
        let item = match code.strip_prefix("pub") {
            Some(rest) if rest.starts_with('(') => rest.split_once(") ").map(|(_, r)| r),
            Some(rest) => Some(rest.trim_start()),
            None => Some(code),
        };
        if let Some(item) = item.filter(|item| item.starts_with("use ")) {
            return Some(at + line.len() - item.len());
        }
        at += line.len();
    }
    None
}

/// Adds the paths of the use tree `tree` under `prefix` to `out`.
fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let item = tree.split(" as ").next().unwrap().replace(' ', "");
        out.push(match item.as_str() {
            "self" => prefix.trim_end_matches("::").to_owned(),
            _ => format!("{prefix}{item}"),
        });
        return;
    };
    let head = format!("{prefix}{}", tree[..open].replace(' ', ""));
    let inner = &tree[open + 1..tree.rfind('}').unwrap()];
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand(&head, &inner[start..i], out);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !inner[start..].trim().is_empty() {
        expand(&head, &inner[start..], out);
    }
}

/// The module paths among `paths` named from `module` (`crate::a::b`,
/// `super::c`, `self::d`, and its own children's), made absolute; the crate's
/// own name counts as `crate` (main.rs names the library so).
fn module_paths(paths: &[String], module: &str, children: &[String]) -> Vec<Vec<String>> {
    let own: Vec<String> = module
        .split("::")
        .filter(|p| !p.is_empty() && *p != "main")
        .map(str::to_owned)
        .collect();
    let mut found = Vec::new();
    for path in paths {
        let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
        let Some((&first, rest)) = parts.split_first() else {
            continue;
        };
        let (base, rest): (Vec<String>, &[&str]) = match first {
            "crate" | "nvidia_textfile_exporter" => (Vec::new(), rest),
            "super" => (own[..own.len().saturating_sub(1)].to_vec(), rest),
            "self" => (own.clone(), rest),
            child if children.iter().any(|c| c == child) => (own.clone(), &parts[..]),
            _ => continue,
        };
        found.push(
            base.into_iter()
                .chain(rest.iter().map(|s| s.to_string()))
                .collect(),
        );
    }
    found
}

/// File-level import graph: module → modules (files) it names.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    let modules: BTreeMap<String, PathBuf> =
        files.iter().map(|f| (module_of(f), f.clone())).collect();
    let mut edges = BTreeMap::new();
    for (module, file) in &modules {
        let prefix = match module.as_str() {
            "" | "main" => String::new(),
            _ => format!("{module}::"),
        };
        let children: Vec<String> = modules
            .keys()
            .filter_map(|m| m.strip_prefix(&prefix))
            .filter(|rest| !rest.is_empty() && !rest.contains("::"))
            .map(str::to_owned)
            .collect();
        let mut targets = BTreeSet::new();
        let paths = paths_in(&product_text(file));
        for path in module_paths(&paths, module, &children) {
            // The longest prefix of the path that is a file of its own.
            let target = (1..=path.len())
                .rev()
                .map(|n| path[..n].join("::"))
                .find(|candidate| modules.contains_key(candidate));
            if let Some(target) = target.filter(|t| t != module) {
                targets.insert(target);
            }
        }
        edges.insert(module.clone(), targets);
    }
    edges
}

/// A cycle in `edges`, as the path that closes it, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|node| visit(node, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_two_files_import_each_other_in_a_cycle() {
    let edges = graph();
    assert!(edges.len() > 30, "only {} files found", edges.len());
    if let Some(cycle) = find_cycle(&edges) {
        panic!("import cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_cycle_check_sees_a_cycle() {
    let mut edges = graph();
    edges
        .get_mut("snapshot")
        .unwrap()
        .insert("collector".to_owned());
    assert!(
        find_cycle(&edges).is_some(),
        "collector -> snapshot -> collector not seen"
    );
}

#[test]
fn no_collector_imports_another() {
    for (module, targets) in graph() {
        if module.starts_with("collectors::") {
            for target in &targets {
                assert!(
                    !target.starts_with("collectors"),
                    "{module} imports {target}"
                );
            }
        }
    }
}

#[test]
fn outside_the_collectors_only_their_registry_is_imported() {
    for (module, targets) in graph() {
        if module == "collectors" || module.starts_with("collectors::") {
            continue;
        }
        let reach = targets.iter().find(|t| t.starts_with("collectors::"));
        assert!(
            reach.is_none(),
            "{} imports {reach:?}; use what `collectors` exports",
            if module.is_empty() { "lib" } else { &module }
        );
    }
}

#[test]
fn imports_are_read_through_use_trees() {
    let text = "use std::fs;\npub(crate) use crate::collectors::{\n    gpus::{self, Recall},\n    HostRun as Run,\n};\nfn f() { nvml_wrapper_sys::bindings::x(); }\n";
    assert_eq!(
        paths_in(text),
        [
            "std::fs",
            "crate::collectors::gpus",
            "crate::collectors::gpus::Recall",
            "crate::collectors::HostRun",
            "nvml_wrapper_sys::bindings::x",
        ]
    );
    let edges = graph();
    assert!(edges["app"].contains("phases"), "{:?}", edges["app"]);
    assert!(
        edges["phases"].contains("collectors"),
        "{:?}",
        edges["phases"]
    );
}

#[test]
fn snapshot_and_render_touch_neither_nvml_nor_files() {
    for file in ["snapshot.rs", "render.rs"] {
        let text = product_text(&Path::new(SRC).join(file));
        for forbidden in ["nvml::", "std::fs", "File::"] {
            assert!(!text.contains(forbidden), "{file} uses {forbidden}");
        }
    }
}

#[test]
fn no_code_outside_the_collectors_names_a_collector() {
    let output = Command::new(env!("CARGO_BIN_EXE_nvidia-textfile-exporter"))
        .args(["--generate", "collectors"])
        .output()
        .unwrap();
    let listing = String::from_utf8(output.stdout).unwrap();
    let names: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split('\t').next())
        .collect();
    assert!(names.len() > 10, "{listing}");
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    // collector/ is what the collectors share (their engines' labels).
    let theirs = |f: &PathBuf| {
        f.starts_with(Path::new(SRC).join("collectors"))
            || f.starts_with(Path::new(SRC).join("collector"))
    };
    for file in files.iter().filter(|f| !theirs(f)) {
        let text = product_text(file);
        for name in &names {
            assert!(
                !text.contains(&format!("\"{name}\"")),
                "{} names the collector {name}",
                file.display()
            );
        }
    }
}
