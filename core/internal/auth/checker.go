// Package auth owns etcd's authentication and authorisation state: users
// (with password hashes, or none for certificate-only users), roles with
// key-range permissions, the enabled switch and the auth revision, kept in
// the store's meta space so that every member of a cluster shares them; and
// the tokens (simple or JWT) that name a user on later requests. It answers
// two questions with etcd's own errors: who makes this request, and may
// they do this.
//
// Only the leader writes the state (Store.Mutate, with its fenced
// writer); every member answers from memory and reloads when its own write
// commits, after a change it forwarded, when a token names a newer auth
// revision, and otherwise by polling the generation record every
// PollInterval. A follower may therefore check a request against a state
// up to about PollInterval old: acceptable because the writes it forwards
// are checked again by the leader, whose state is current, and a read
// served under a grant revoked a moment ago is what etcd's own followers
// serve until they apply the change.
//
// The leader cannot name the caller of a call a follower forwards from
// the call's own credentials: a simple token lives only on the member that
// issued it, and a client certificate does not cross the follower's
// connection. The follower, which named the caller and checked the request,
// sends the name, the auth revision and an expiry signed with HMAC-SHA256
// under a 32-byte key that the first member to open wrote to the meta space
// (forward.go). A member trusts the name only under a valid, unexpired
// signature, and refuses a present but invalid one: the key is readable
// only by members (no etcd call reads the meta space), so trusting it
// trusts exactly the members and whoever can read the store.
//
// It must not serve gRPC (etcdapi does) nor decide which permissions a
// request needs (etcdapi's authorisation step walks each request, nested
// Txn ops included, and asks this package about each key range).
package auth

import "context"

// Info is who makes a request: the user a token or a TLS client
// certificate names, and the auth revision the token was issued at
// (etcd refuses a token older than a change of users or roles).
type Info struct {
	Username string
	Revision uint64
}

// Checker is what the request path asks of the auth state. Every method is
// safe for concurrent use and answers from memory: none may read the store
// on a request's path.
type Checker interface {
	// Enabled reports whether auth is on; when it is off no check applies
	// and every method below answers nil.
	Enabled() bool
	// Caller names the caller of ctx: the user of the "token" metadata,
	// else (with client certificate authentication) the common name of
	// the verified TLS client certificate. It answers (nil, nil) when
	// auth is off or the request carries neither, and etcd's invalid-token
	// error for a token it does not know.
	Caller(ctx context.Context) (*Info, error)
	// IsRangePermitted reports whether the caller may read [key, rangeEnd)
	// (rangeEnd as in a RangeRequest: empty for one key, "\x00" for every
	// key from key on).
	IsRangePermitted(ai *Info, key, rangeEnd []byte) error
	// IsPutPermitted reports whether the caller may write key.
	IsPutPermitted(ai *Info, key []byte) error
	// IsDeleteRangePermitted reports whether the caller may write every key
	// of [key, rangeEnd).
	IsDeleteRangePermitted(ai *Info, key, rangeEnd []byte) error
	// IsAdminPermitted reports whether the caller holds the root role.
	IsAdminPermitted(ai *Info) error
}
