package server

import (
	"context"

	"google.golang.org/grpc"
)

// adminAuth applies etcd's root-only rule to the calls whose handlers do
// not check it themselves (etcdapi.Services.AdminInterceptor). It looks up
// the services per call because a cluster member replaces them on start.
func (s *Server) adminAuth(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.api == nil {
		return handler(ctx, req)
	}
	return s.api.AdminInterceptor()(ctx, req, info, handler)
}
