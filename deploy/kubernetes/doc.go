// Package kubernetes holds the test that renders toolq's Kubernetes manifests
// (kustomize, in this directory) and checks them. It is a module of its own so
// that the main module does not carry the Kubernetes API types.
package kubernetes
