// Package fleet is syncloop's cluster inventory: the kubeconfig Secrets
// of one namespace, in Cluster API's convention (<name>-kubeconfig, key
// value, label cluster.x-k8s.io/cluster-name), each made into a client
// (dynamic.Remote) as it appears or changes and forgotten as it goes, and
// whether each cluster answers (a cluster a request found not answering
// is probed until it does).
//
// It hands the engine clusters (rules.Cluster: names and labels) and ways
// to reach them; it does not know what rules put there, start informers
// or write to a cluster. It never logs, records or returns what a
// kubeconfig holds.
package fleet
