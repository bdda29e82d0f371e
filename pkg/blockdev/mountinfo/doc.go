// Package mountinfo reads the calling process's mount table
// (/proc/self/mountinfo) and answers questions about it: which mount holds
// a path, whether it is read-only or shared, and whether a mount made now
// would die with this process (MountDiesWithProcess, which a ublk server
// must never let happen to its own device). It only reads.
package mountinfo
