// Package peer is the channel between the plugins of one installation: a
// plugin asks the plugin of another node to do what only that node can do
// to its own node-local objects: ControllerModifyVolume and
// ControllerExpandVolume, which the external-resizer's one leader sends to
// its own node's plugin whatever node the volume lives on; CreateVolume
// from a source of that node (a handoff); and ReadData, a stream of a
// snapshot's or volume's data for a restore or clone on another node,
// checked frame by frame and end to end (stream.go, frame.go); and the CSI
// SnapshotMetadata calls of a backup application for a snapshot of that
// node, streamed back message by message (metadata.go).
//
// The channel is gRPC over mutual TLS 1.3. Every plugin of an installation
// shares one CA, kept in a Secret of the installation's namespace that the
// chart's hook Job creates (EnsureCA) and the plugins only read (ReadCA);
// each plugin issues itself a short-lived certificate from it
// (Credentials) that names the installation in a URI SAN (Identity). The
// certificate encrypts and keeps strangers out; since every plugin reads
// the CA, it is no proof of a node. Which node a peer is, the projected
// service-account token of its pod proves (Tokens, Authenticator;
// token.go): the server serves only the plugin pod of the node a call
// speaks for, from that pod's address, and the client takes answers only
// from the plugin pod of the node it meant. docs/peer.md has the threat
// model.
//
// A peer names objects by ID only. The service carries the CSI messages of
// the calls it forwards (stripped of secrets), and the stream's own
// messages of a fixed binary layout; what the receiving plugin does with
// them is its Handler's business, which must validate IDs as it does for
// the CSI socket. Messages are bounded in size, and so is what one peer
// may hold of a server: connections, calls, data streams, their rate and
// length (Limits; docs/peer.md, "Bounded peers"). A panic in a call or a
// stream ends it with Internal, not the plugin.
//
// Peers are found through the API server (PodResolver): the running pods
// of the installation's DaemonSets, by node, from one watch of them, so a
// restarted pod's new address is used as soon as the watch brings it and
// a call asks the API server nothing. Token reviews are cached a short
// while, and a peer's pod is read from the same watch (Authenticator).
//
// Credentials, Server, Client, Tokens and Authenticator are safe for
// concurrent use.
package peer
