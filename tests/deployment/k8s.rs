//! `deploy/k8s/`: the StatefulSet's container, env and mounted Secret, its
//! probes and the Services' target ports, against a running rankd.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use serde_json::Value as Json;

use crate::dockerfile::{container_argv, image_uid, runtime_stage};
use crate::files::{repo, strings, text, yaml_doc, yaml_file};
use crate::launch::{check_clients, fill_tokens, signal_named, Grant, Launch};
/// The documents `kubectl apply -k deploy/k8s` sends: rendered by
/// `kubectl kustomize` when kubectl is there, else the kustomization's
/// resources as written (and its `images:` checked by hand).
fn k8s_documents() -> Vec<Json> {
    let dir = repo().join("deploy/k8s");
    let kustomization = yaml_doc("deploy/k8s/kustomization.yaml");
    let mut docs = Vec::new();
    for resource in strings(&kustomization["resources"], "resources") {
        docs.extend(yaml_file(&dir.join(resource)));
    }
    let images = kustomization["images"].as_array().cloned().unwrap_or_default();
    let rendered = Command::new("kubectl").arg("kustomize").arg(&dir).output();
    match rendered {
        Ok(out) => {
            assert!(out.status.success(), "kubectl kustomize deploy/k8s:\n{}", String::from_utf8_lossy(&out.stderr));
            let file = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(file.path(), &out.stdout).unwrap();
            let rendered = yaml_file(file.path());
            let names = |docs: &[Json]| -> BTreeSet<String> {
                docs.iter().map(|d| format!("{}/{}", d["kind"], d["metadata"]["name"])).collect()
            };
            assert_eq!(names(&rendered), names(&docs), "kubectl kustomize renders the resources listed");
            for image in &images {
                let want = format!("{}:{}", text(image, "newName", "images"), text(image, "newTag", "images"));
                let found = rendered.iter().filter(|d| d["kind"] == "StatefulSet").all(|d| {
                    d["spec"]["template"]["spec"]["containers"].as_array().unwrap().iter().any(|c| c["image"] == want)
                });
                assert!(found, "kustomize sets the image to {want}");
            }
            rendered
        }
        Err(e) => {
            eprintln!("NOTE: no kubectl ({e}): deploy/k8s checked from its resource files, not rendered by kustomize");
            for image in &images {
                let name = text(image, "name", "images");
                let used = docs.iter().filter(|d| d["kind"] == "StatefulSet").all(|d| {
                    d["spec"]["template"]["spec"]["containers"].as_array().unwrap().iter().any(|c| c["image"] == name)
                });
                assert!(used, "kustomization.yaml's image {name} is the one the StatefulSet runs");
            }
            docs
        }
    }
}

fn find<'a>(docs: &'a [Json], kind: &str, name: &str) -> &'a Json {
    let mut found = docs.iter().filter(|d| d["kind"] == kind && d["metadata"]["name"] == name);
    let doc = found.next().unwrap_or_else(|| panic!("no {kind} {name}"));
    assert!(found.next().is_none(), "two of {kind} {name}");
    doc
}

/// Whether every label of `selector` is on `labels`.
fn selects(selector: &Json, labels: &Json) -> bool {
    let selector = selector.as_object().expect("a selector");
    !selector.is_empty() && selector.iter().all(|(k, v)| &labels[k] == v)
}

/// A container port named or numbered `port` (a probe's or a Service's target).
fn container_port(container: &Json, port: &Json) -> u16 {
    let ports = container["ports"].as_array().expect("container ports");
    let found = match port {
        Json::Number(n) => ports.iter().find(|p| p["containerPort"].as_u64() == n.as_u64()),
        Json::String(name) => ports.iter().find(|p| p["name"] == name.as_str()),
        other => panic!("a port is a number or a name: {other}"),
    };
    let found = found.unwrap_or_else(|| panic!("port {port} is none of the container's: {ports:?}"));
    found["containerPort"].as_u64().expect("containerPort") as u16
}

#[test]
fn the_kubernetes_statefulset_starts_rankd_and_its_probes_answer() {
    let docs = k8s_documents();
    let statefulset = docs.iter().find(|d| d["kind"] == "StatefulSet").expect("a StatefulSet");
    assert!(
        docs.iter().all(|d| d["kind"] != "Secret"),
        "the kustomization ships no Secret: the tokens are the operator's, created from a file"
    );
    let spec = &statefulset["spec"];
    let pod = &spec["template"]["spec"];
    let labels = &spec["template"]["metadata"]["labels"];
    assert_eq!(spec["replicas"], 1, "one rankd (it is no cluster: more replicas would be separate servers)");
    assert!(selects(&spec["selector"]["matchLabels"], labels), "the StatefulSet selects its pods");
    let headless = find(&docs, "Service", text(spec, "serviceName", "StatefulSet"));
    assert_eq!(headless["spec"]["clusterIP"], "None", "serviceName is a headless Service");
    let grace = pod["terminationGracePeriodSeconds"].as_u64().expect("terminationGracePeriodSeconds");
    assert!(grace >= 60, "terminationGracePeriodSeconds {grace} leaves SIGTERM time to commit");

    let runtime = runtime_stage();
    let security = &pod["securityContext"];
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["runAsUser"], image_uid(&runtime), "runAsUser is the image's user");
    assert!(security["fsGroup"].is_u64(), "fsGroup makes the volume the user's");
    let containers = pod["containers"].as_array().expect("containers");
    let container = containers.iter().find(|c| c["name"] == "rankd").expect("a container rankd");
    let hardened = &container["securityContext"];
    assert_eq!(hardened["readOnlyRootFilesystem"], true);
    assert_eq!(hardened["allowPrivilegeEscalation"], false);
    assert_eq!(hardened["capabilities"]["drop"], serde_json::json!(["ALL"]));

    let field = |key: &str| (!container[key].is_null()).then(|| strings(&container[key], key));
    let argv = container_argv(&runtime, field("command"), field("args"));

    // The environment, and the files its volumes put in place: the Secret
    // (from secret.example.yaml) where the manifest mounts it.
    let secrets = yaml_file(&repo().join("deploy/k8s/secret.example.yaml"));
    let mut env = runtime.env();
    for var in container["env"].as_array().cloned().unwrap_or_default() {
        let name = text(&var, "name", "env").to_string();
        let value = match (&var["value"], &var["valueFrom"]["secretKeyRef"]) {
            (Json::String(value), _) => value.clone(),
            (_, key) if key.is_object() => {
                let secret = find(&secrets, "Secret", text(key, "name", "secretKeyRef"));
                text(&secret["stringData"], text(key, "key", "secretKeyRef"), "the Secret").to_string()
            }
            _ => panic!("env {name}: a value or a secretKeyRef"),
        };
        env.push((name, value));
    }
    let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
    let claims = spec["volumeClaimTemplates"].as_array().expect("volumeClaimTemplates: a volume per pod");
    let mut files = Vec::new();
    let mut data_mount = None;
    for mount in container["volumeMounts"].as_array().expect("volumeMounts") {
        let (name, path) = (text(mount, "name", "volumeMount"), text(mount, "mountPath", "volumeMount"));
        if claims.iter().any(|claim| claim["metadata"]["name"] == name) {
            data_mount = Some(path.to_string());
            continue;
        }
        let volume = volumes.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no volume {name}"));
        let source = &volume["secret"];
        assert!(source.is_object(), "volume {name}: only Secret volumes are expected");
        assert_eq!(mount["readOnly"], true, "the Secret is mounted read-only");
        let secret = find(&secrets, "Secret", text(source, "secretName", "secret volume"));
        let data = secret["stringData"].as_object().expect("the example Secret has stringData");
        let items: Vec<(String, String)> = match source["items"].as_array() {
            Some(items) => {
                items.iter().map(|i| (text(i, "key", "items").into(), text(i, "path", "items").into())).collect()
            }
            None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
        };
        for (key, file) in items {
            let content = data.get(&key).and_then(Json::as_str).unwrap_or_else(|| panic!("the Secret has no {key}"));
            files.push((format!("{}/{file}", path.trim_end_matches('/')), content.to_string()));
        }
    }
    let launch = Launch { what: "deploy/k8s's StatefulSet".into(), argv, env, files };
    assert_eq!(data_mount.as_deref(), Some(launch.data_dir()), "the per-pod volume is mounted at --data-dir");
    let (client, metrics) = (launch.client_addr(), launch.metrics_addr());
    assert!(
        client.ip().is_unspecified() && metrics.ip().is_unspecified(),
        "rankd listens on the pod's IP (where Services and the kubelet's probes connect), not loopback"
    );
    let annotations = &spec["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/port"], metrics.port().to_string(), "the scrape annotation");

    // As shipped, the example Secret's empty tokens are refused.
    let refused = launch.refused();
    assert!(
        refused.contains("has an empty token"),
        "secret.example.yaml's placeholders must not start a server: {refused}"
    );
    let tokens_file = launch.env.iter().find(|(k, _)| k == "RANKD_TOKENS_FILE").map(|(_, v)| v.clone());
    let tokens_file = tokens_file.expect("RANKD_TOKENS_FILE names the mounted tokens file");
    let (filled, read, write) = {
        let (_, example) = launch.files.iter().find(|(path, _)| *path == tokens_file).expect("the file is mounted");
        fill_tokens(example)
    };
    let files =
        launch.files.iter().map(|(p, c)| (p.clone(), if *p == tokens_file { filled.clone() } else { c.clone() }));
    let launch = Launch { files: files.collect(), what: "deploy/k8s's StatefulSet, tokens filled in".into(), ..launch };
    let server = launch.start();

    // Every probe answers 200 on the port it names, which is the metrics port.
    for (probe, path) in [("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe} asks {path}");
        assert!(get["scheme"].is_null() || get["scheme"] == "HTTP", "{probe}: rankd's metrics are plain HTTP here");
        let port = container_port(container, &get["port"]);
        assert_eq!(port, metrics.port(), "{probe} asks the metrics port");
        assert_eq!(server.get(port, path), Ok(200), "{probe}: GET {path} on port {port}");
    }
    // The Services reach the container's ports; the client one, rankd's clients.
    for service in docs.iter().filter(|d| d["kind"] == "Service") {
        let name = text(&service["metadata"], "name", "Service");
        assert!(selects(&service["spec"]["selector"], labels), "Service {name} selects the pods");
        for port in service["spec"]["ports"].as_array().expect("ports") {
            let target = container_port(container, &port["targetPort"]);
            assert!(target == client.port() || target == metrics.port(), "Service {name} targets a port rankd serves");
        }
    }
    let clients = find(&docs, "Service", "rankd");
    let ports = clients["spec"]["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1, "the client Service carries the client port only");
    assert_eq!(container_port(container, &ports[0]["targetPort"]), client.port());
    check_clients(server.at(client.port()), Grant::Roles { read: &read, write: &write });
    // The container runtime stops with the image's STOPSIGNAL.
    server.stop(signal_named(runtime.one("STOPSIGNAL")), Duration::from_secs(grace));
}
