package server

import (
	"context"
	"fmt"

	"github.com/engramkv/engram/core/internal/auth"
)

// openAuth loads the auth state from the store and keeps it current until
// runCtx ends: each member polls the revision record, so changes the
// leader commits reach followers (and a node that was follower before).
// A bad auth-token value stops start-up with an error naming it.
func (s *Server) openAuth(ctx, runCtx context.Context) (*auth.Store, error) {
	tokens, err := auth.NewTokens(s.opts.Auth.Token, s.opts.Auth.TokenTTL)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	st, err := auth.Open(ctx, auth.Options{
		Store:      s.opts.Store,
		Tokens:     tokens,
		BcryptCost: s.opts.Auth.BcryptCost,
		// Verified client chains exist only when the listener verifies
		// client certificates (tls.client-ca-file), which is when etcd's
		// --client-cert-auth names a caller by its certificate.
		ClientCertAuth: true,
		Logger:         s.log.With("component", "auth"),
	})
	if err != nil {
		return nil, fmt.Errorf("server: open auth state: %w", err)
	}
	go st.Run(runCtx)
	return st, nil
}
