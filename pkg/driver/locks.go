package driver

import (
	"context"
	"sync"
)

// keyLocks serialises operations per key (a volume or snapshot ID or name).
// Unlike a sync.Mutex per key, waiting honours the caller's context, and
// entries are dropped when nobody holds or waits for them.
type keyLocks struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	ch   chan struct{} // holds one token while the key is locked
	refs int
}

func newKeyLocks() *keyLocks { return &keyLocks{locks: map[string]*keyLock{}} }

// lock blocks until key is free or ctx is done. On success the returned
// function releases the key.
func (k *keyLocks) lock(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	l, ok := k.locks[key]
	if !ok {
		l = &keyLock{ch: make(chan struct{}, 1)}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()

	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; k.release(key, l) }, nil
	case <-ctx.Done():
		k.release(key, l)
		return nil, ctx.Err()
	}
}

func (k *keyLocks) release(key string, l *keyLock) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l.refs--
	if l.refs == 0 {
		delete(k.locks, key)
	}
}
