//! The deployment files start rankd as they are written. There is no
//! container engine, kubelet or systemd manager here, so each test reads a
//! file the way its platform would, takes the exact rankd command line and
//! environment it gives, and runs the real binary with them until `/readyz`
//! answers 200; then it checks the file's health checks and probes against
//! what that server serves, talks to it with the token the file provides,
//! and stops it with the file's stop signal within the file's grace period.
//!
//! - `Dockerfile`: `ENTRYPOINT` + `CMD`, refused without a token (as
//!   `docker run` without `-e` would be), started with one; `EXPOSE` and
//!   `VOLUME` match the flags; its `HEALTHCHECK` script (the file the
//!   image copies) passes against the ready server and fails against a
//!   closed port and a 503.
//! - `grafana/docker-compose.yml`: the `rankd` service's command (the
//!   image's) and environment, interpolated from `grafana/.env.example` as
//!   compose would: refused as shipped (empty token), run once a token is set.
//! - `deploy/k8s/`: the StatefulSet's container (`command`/`args` over the
//!   image's), its env, its Secret mounted where the manifest mounts it (from
//!   `secret.example.yaml`: refused with its empty placeholders, run with
//!   tokens filled in), the three probes on the ports they name, and the
//!   Services' target ports.
//! - `deploy/systemd/rankd.service`: `systemd-analyze verify` and `security`,
//!   then `ExecStart` with its specifiers and `${STATE_DIRECTORY}` expanded
//!   as systemd would, its `Environment=` and `LoadCredential=` file.
//!
//! What is swapped, and nothing else: the program (`rankd`,
//! `/usr/local/bin/rankd`) is this build's binary; every port in
//! `--listen`/`--metrics-listen` becomes 0 (the host part is kept, so
//! `0.0.0.0` still needs its token) and the file's ports are mapped to the
//! ones the server reports; every absolute path in the arguments and the
//! environment is taken under a temporary root, where the files the
//! platform would mount (a Secret, a credential) are written.
//!
//! YAML is read with Python's PyYAML (Debian's python3-yaml, which `.ci/run`
//! installs if it is missing); the systemd checks need `systemd-analyze`
//! (Debian's systemd package, likewise). Both fail the test when missing,
//! never skip it. `kubectl kustomize` also renders `deploy/k8s` when
//! `kubectl` is on the PATH (it is no Debian package; without it the test
//! says so and reads the kustomization's resources itself).

#[path = "../common/mod.rs"]
mod common;

mod compose;
mod dockerfile;
mod files;
mod k8s;
mod launch;
mod systemd;
