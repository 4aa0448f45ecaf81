package server_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/internal/etcdtest"
)

// TestAuthPermDiff sends every request shape as a restricted user, with
// no token and with a garbage token, to etcd 3.6 and to Engram after the
// same users, roles and auth enable, and compares code and message of
// each answer, and each watch create's response.
func TestAuthPermDiff(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t, etcdtest.Options{})
	// bcrypt's cost changes no answer, only how long a -race run takes.
	g := servertest.Start(t, memkv.New(), servertest.Options{Auth: server.AuthOptions{BcryptCost: 4}})
	ectx, econn := rawConn(t, e.Endpoint)
	gctx, gconn := rawConn(t, g.Endpoint)
	etok, gtok := authPermSetup(t, ectx, econn), authPermSetup(t, gctx, gconn)
	want, got := authPermAnswers(t, ectx, econn, etok), authPermAnswers(t, gctx, gconn, gtok)
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: Engram answers %q, etcd %q", k, got[k], w)
		}
	}
	for _, w := range []struct{ caller, key string }{{"u", "/c"}, {"u", "/a/x"}, {"", "/a/x"}, {"garbage", "/a/x"}} {
		er := watchCreateAnswer(t, ectx, econn, etok[w.caller], w.key)
		gr := watchCreateAnswer(t, gctx, gconn, gtok[w.caller], w.key)
		if er.Canceled {
			// An accepted watch's ID is the stream's to choose.
			if !proto.Equal(er, gr) {
				t.Errorf("%q watch %s: Engram %v, etcd %v", w.caller, w.key, gr, er)
			}
		} else if gr.Canceled || !gr.Created {
			t.Errorf("%q watch %s: Engram %v, etcd %v", w.caller, w.key, gr, er)
		}
	}
}
