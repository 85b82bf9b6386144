// Package deploytest holds the static checks of everything lock.dev ships for
// deployment: the container image's Dockerfile, compose.yaml, the Kubernetes
// manifests of deploy/k8s and the observability pack of deploy/observability.
// It has no code of its own: its tests load each artifact with the library its
// users' tools are built on (the kustomize API, the compose-spec loader,
// Prometheus's rule parser and PromQL parser) and hold it to the contracts, so a
// renamed metric, a missing probe or a policy that lets another pod reach the
// rail breaks the build.
//
// Those libraries are heavy, so the package lives in a module of its own,
// lock.dev/checks (checks/go.mod, which takes lock.dev from this tree): lock.dev's
// go.mod does not require them, and a program that takes only lock.dev's client
// never meets them in its module graph. Being under lock.dev/, it may still import
// lock.dev's internal packages (the services' metric names). Run it from checks/:
// `cd checks && go test ./...` (.ci/run does).
package deploytest
