// Package owner keeps a data directory's owner token: a random 64-bit value
// in <data dir>/owner that every device made for the directory carries (ublk
// in ublksrv_flags, loop in its lo_file_name mark), so that a restarted
// plugin recognises its own devices however the directory is reached, and
// never touches another plugin's.
//
// Ensure creates the token on first use (adopting the one that devices
// recorded by an older plugin carry); Read only reads, for commands that
// must change nothing on the node.
package owner
