//! Reading the repository's deployment files: text, and YAML as JSON values
//! through PyYAML (YAML 1.1, as Kubernetes reads manifests).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value as Json;
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn read_text(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// A python3 that imports `yaml`: Debian's first (python3-yaml), then
/// whichever `python3` is on the PATH.
fn python_with_yaml() -> &'static str {
    static PYTHON: OnceLock<&'static str> = OnceLock::new();
    PYTHON.get_or_init(|| {
        for python in ["/usr/bin/python3", "python3"] {
            let imports = Command::new(python)
                .args(["-c", "import yaml"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|status| status.success());
            if imports {
                return python;
            }
        }
        panic!(
            "tests/deployment/ reads YAML with Python's PyYAML and found no python3 that imports it: \
             apt-get install python3-yaml (.ci/run does)"
        )
    })
}

/// Every document of a YAML file, as JSON values (PyYAML's safe loader:
/// YAML 1.1, as Kubernetes reads manifests).
pub fn yaml_file(path: &Path) -> Vec<Json> {
    const TO_JSON: &str = "import json, sys, yaml\n\
                           with open(sys.argv[1]) as f:\n    \
                               docs = [d for d in yaml.safe_load_all(f) if d is not None]\n\
                           json.dump(docs, sys.stdout)";
    let out = Command::new(python_with_yaml()).args(["-c", TO_JSON]).arg(path).output().expect("run python3");
    assert!(out.status.success(), "{} is not valid YAML:\n{}", path.display(), String::from_utf8_lossy(&out.stderr));
    match serde_json::from_slice(&out.stdout).expect("python printed JSON") {
        Json::Array(docs) => docs,
        other => panic!("not a list of documents: {other}"),
    }
}

/// The one document of a YAML file in the repository.
pub fn yaml_doc(relative: &str) -> Json {
    let mut docs = yaml_file(&repo().join(relative));
    assert_eq!(docs.len(), 1, "{relative} holds one document");
    docs.remove(0)
}

/// `value[key]` as a string, failing the test with `what` if it is not one.
pub fn text<'a>(value: &'a Json, key: &str, what: &str) -> &'a str {
    value[key].as_str().unwrap_or_else(|| panic!("{what}: no string `{key}` in {value}"))
}

pub fn strings(value: &Json, what: &str) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("{what}: not a list: {value}"))
        .iter()
        .map(|item| match item {
            Json::String(s) => s.clone(),
            Json::Number(n) => n.to_string(),
            other => panic!("{what}: not a string: {other}"),
        })
        .collect()
}
