// Package footprint holds the checks of what a program that takes lock.dev's
// client packages — lockclient, and the fence kit when it is present — takes
// with it: the packages it links and the modules lock.dev's go.mod makes it
// require. It has no code of its own. The checks of what lock.dev ships for
// deployment (the compose file, the Kubernetes manifests, the alert rules)
// need heavy modules — the kustomize API, the compose-spec loader, Prometheus
// — so they live in a module of their own, checks/ (lock.dev/checks), and a
// user's module graph never meets them; these tests keep it so.
package footprint
