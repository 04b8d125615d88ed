//! The source's layering, checked on the files themselves: no two files
//! import each other in a cycle (directly or through others), `nvml` never
//! imports the collectors above it, `snapshot` and `render` touch neither NVML
//! nor the file system, and no code outside `src/collectors/` names a
//! collector.

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

/// The module path of a file (`collectors::gpm`; `""` for lib.rs and main.rs).
fn module_of(file: &Path) -> String {
    let relative = file.strip_prefix(SRC).unwrap().with_extension("");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
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

/// The module paths named in `text` (`crate::a::b`, `super::c`, and in a
/// module root the paths of its own children), as written.
fn named_paths(text: &str, module: &str, children: &[String]) -> Vec<Vec<String>> {
    let parent: Vec<String> = module
        .split("::")
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    let mut paths = Vec::new();
    let words: Vec<&str> = text
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.contains("::"))
        .collect();
    for word in words {
        let parts: Vec<&str> = word.split("::").filter(|p| !p.is_empty()).collect();
        let Some((&first, rest)) = parts.split_first() else {
            continue;
        };
        let base: Vec<String> = match first {
            "crate" => Vec::new(),
            "super" => parent[..parent.len().saturating_sub(1)].to_vec(),
            child if children.iter().any(|c| c == child) => {
                let mut base = parent.clone();
                base.push(child.to_owned());
                paths.push(
                    base.iter()
                        .cloned()
                        .chain(rest.iter().map(|s| s.to_string()))
                        .collect(),
                );
                continue;
            }
            _ => continue,
        };
        paths.push(
            base.into_iter()
                .chain(rest.iter().map(|s| s.to_string()))
                .collect(),
        );
    }
    paths
}

/// File-level import graph: module → modules (files) it names.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    let modules: BTreeMap<String, PathBuf> = files
        .iter()
        .filter(|f| !f.ends_with("main.rs"))
        .map(|f| (module_of(f), f.clone()))
        .collect();
    let mut edges = BTreeMap::new();
    for (module, file) in &modules {
        let prefix = if module.is_empty() {
            String::new()
        } else {
            format!("{module}::")
        };
        let children: Vec<String> = modules
            .keys()
            .filter_map(|m| m.strip_prefix(&prefix))
            .filter(|rest| !rest.is_empty() && !rest.contains("::"))
            .map(str::to_owned)
            .collect();
        let mut targets = BTreeSet::new();
        for path in named_paths(&product_text(file), module, &children) {
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
        .get_mut("nvml::fields")
        .unwrap()
        .insert("nvml::reader".to_owned());
    assert!(
        find_cycle(&edges).is_some(),
        "reader -> fields -> reader not seen"
    );
}

#[test]
fn nvml_is_below_the_collectors() {
    for (module, targets) in graph() {
        if module == "nvml" || module.starts_with("nvml::") {
            for target in &targets {
                assert!(
                    !(target == "collectors" || target.starts_with("collectors::")),
                    "{module} imports {target}"
                );
            }
        }
    }
}

#[test]
fn snapshot_and_render_touch_neither_nvml_nor_files() {
    for file in ["snapshot.rs", "render.rs"] {
        let text = product_text(&Path::new(SRC).join(file));
        for forbidden in ["nvml_wrapper", "std::fs", "crate::nvml", "File::"] {
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
    for file in files
        .iter()
        .filter(|f| !f.starts_with(Path::new(SRC).join("collectors")))
    {
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
