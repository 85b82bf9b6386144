// Package deploytest holds the static checks of everything lock.dev ships for
// deployment: the container image's Dockerfile, compose.yaml, the Kubernetes
// manifests of deploy/k8s and the observability pack of deploy/observability.
// It has no code of its own: its tests load each artifact with the library its
// users' tools are built on (the kustomize API, the compose-spec loader,
// Prometheus's rule parser and PromQL parser) and hold it to the contracts, so a
// renamed metric, a missing probe or a policy that lets another pod reach the
// rail breaks the build. The heavy modules they need are imported by these
// tests only; no binary links them.
package deploytest
