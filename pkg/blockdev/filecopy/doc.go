// Package filecopy copies volume files: a reflink where the filesystem
// shares extents (xfs with reflink=1, btrfs), a sparse-aware copy that
// keeps holes holes everywhere else, and a resync that makes an earlier copy
// equal to its source again by writing only the blocks that differ. Every
// copy is durable (fsynced, with its directory entry) when it returns.
//
// It knows files only: which volume is copied, and whether it is held
// steady meanwhile, is the store's business.
package filecopy
