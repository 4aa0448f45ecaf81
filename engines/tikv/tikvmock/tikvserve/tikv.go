package tikvserve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pingcap/kvproto/pkg/kvrpcpb"
	"github.com/pingcap/kvproto/pkg/tikvpb"
	"github.com/tikv/client-go/v2/tikvrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// mockTimeout is the timeout handed to the mock with each request (the
// mock only uses it for coprocessor requests, which are not served).
const mockTimeout = 30 * time.Second

// tikvService is TiKV's gRPC service of one store: every command is run by
// the mock's RPC client as if sent to this store's address, so the mock
// checks the region, epoch and leader against this store as TiKV would.
//
// client-go sends every transactional command through BatchCommands
// streams (its batch client is on by default); the only unary call it
// makes is the safe timestamp poll.
type tikvService struct {
	tikvpb.UnimplementedTikvServer
	s      *Server
	addr   string
	served *atomic.Int64
}

// BatchCommands runs each command of each batch as it arrives, all at
// once, and answers each as soon as it is done, with its request ID, as
// TiKV does. A command the fake cannot run ends the stream with its
// error.
func (t *tikvService) BatchCommands(stream tikvpb.Tikv_BatchCommandsServer) error {
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	var (
		sendMu sync.Mutex
		wg     sync.WaitGroup
	)
	defer wg.Wait()
	batches := make(chan *tikvpb.BatchCommandsRequest)
	go func() {
		for {
			b, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				cancel(err)
				return
			}
			select {
			case batches <- b:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		var b *tikvpb.BatchCommandsRequest
		select {
		case <-ctx.Done():
			err := context.Cause(ctx)
			if errors.Is(err, context.Canceled) {
				return nil // the client went away or closed the stream
			}
			return err
		case b = <-batches:
		}
		ids := b.GetRequestIds()
		if len(ids) != len(b.GetRequests()) {
			return status.Errorf(codes.InvalidArgument, "tikvserve: a batch of %d commands with %d request IDs", len(b.GetRequests()), len(ids))
		}
		for i, cmd := range b.GetRequests() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := t.run(ctx, cmd)
				if err != nil {
					cancel(err)
					return
				}
				sendMu.Lock()
				defer sendMu.Unlock()
				err = stream.Send(&tikvpb.BatchCommandsResponse{Responses: []*tikvpb.BatchCommandsResponse_Response{resp}, RequestIds: []uint64{ids[i]}})
				if err != nil {
					cancel(err)
				}
			}()
		}
	}
}

// run runs one command of a batch on the mock.
func (t *tikvService) run(ctx context.Context, cmd *tikvpb.BatchCommandsRequest_Request) (*tikvpb.BatchCommandsResponse_Response, error) {
	if e, ok := cmd.GetCmd().(*tikvpb.BatchCommandsRequest_Request_Empty); ok {
		// client-go's probe of an idle stream; TiKV echoes it.
		empty := &tikvpb.BatchCommandsEmptyResponse{TestId: e.Empty.GetTestId()}
		return &tikvpb.BatchCommandsResponse_Response{Cmd: &tikvpb.BatchCommandsResponse_Response_Empty{Empty: empty}}, nil
	}
	req, err := fromBatchRequest(cmd)
	if err != nil {
		return nil, err
	}
	t.served.Add(1)
	resp, err := t.s.mock.Client.SendRequest(ctx, t.addr, req, mockTimeout)
	if err != nil {
		// The mock fails a request only when the store is unknown or
		// the caller is gone; either way the stream cannot go on.
		return nil, status.Errorf(codes.Unavailable, "tikvserve: %s on the mock: %v", req.Type, err)
	}
	return toBatchResponse(resp)
}

// withContext is every transactional request: each carries the region,
// epoch and peer it was sent to.
type withContext interface{ GetContext() *kvrpcpb.Context }

// fromBatchRequest is the command as client-go built it before it put it
// in the batch (tikvrpc.Request.ToBatchCommandsRequest's reverse), for the
// commands of the transactional API the adaptor uses.
func fromBatchRequest(cmd *tikvpb.BatchCommandsRequest_Request) (*tikvrpc.Request, error) {
	var (
		typ   tikvrpc.CmdType
		inner withContext
	)
	switch c := cmd.GetCmd().(type) {
	case *tikvpb.BatchCommandsRequest_Request_Get:
		typ, inner = tikvrpc.CmdGet, c.Get
	case *tikvpb.BatchCommandsRequest_Request_BatchGet:
		typ, inner = tikvrpc.CmdBatchGet, c.BatchGet
	case *tikvpb.BatchCommandsRequest_Request_Scan:
		typ, inner = tikvrpc.CmdScan, c.Scan
	case *tikvpb.BatchCommandsRequest_Request_Prewrite:
		typ, inner = tikvrpc.CmdPrewrite, c.Prewrite
	case *tikvpb.BatchCommandsRequest_Request_Commit:
		typ, inner = tikvrpc.CmdCommit, c.Commit
	case *tikvpb.BatchCommandsRequest_Request_Cleanup:
		typ, inner = tikvrpc.CmdCleanup, c.Cleanup
	case *tikvpb.BatchCommandsRequest_Request_BatchRollback:
		typ, inner = tikvrpc.CmdBatchRollback, c.BatchRollback
	case *tikvpb.BatchCommandsRequest_Request_ScanLock:
		typ, inner = tikvrpc.CmdScanLock, c.ScanLock
	case *tikvpb.BatchCommandsRequest_Request_ResolveLock:
		typ, inner = tikvrpc.CmdResolveLock, c.ResolveLock
	case *tikvpb.BatchCommandsRequest_Request_CheckTxnStatus:
		typ, inner = tikvrpc.CmdCheckTxnStatus, c.CheckTxnStatus
	case *tikvpb.BatchCommandsRequest_Request_CheckSecondaryLocks:
		typ, inner = tikvrpc.CmdCheckSecondaryLocks, c.CheckSecondaryLocks
	case *tikvpb.BatchCommandsRequest_Request_TxnHeartBeat:
		typ, inner = tikvrpc.CmdTxnHeartBeat, c.TxnHeartBeat
	default:
		return nil, status.Errorf(codes.Unimplemented, "tikvserve: BatchCommands command %T is not served", c)
	}
	var kctx kvrpcpb.Context
	if c := inner.GetContext(); c != nil {
		kctx = *c
	}
	return tikvrpc.NewRequest(typ, inner, kctx), nil
}

// toBatchResponse puts the mock's answer in a batch response
// (tikvrpc.FromBatchCommandsResponse's reverse).
func toBatchResponse(resp *tikvrpc.Response) (*tikvpb.BatchCommandsResponse_Response, error) {
	out := &tikvpb.BatchCommandsResponse_Response{}
	switch r := resp.Resp.(type) {
	case *kvrpcpb.GetResponse:
		out.Cmd = &tikvpb.BatchCommandsResponse_Response_Get{Get: r}
	case *kvrpcpb.BatchGetResponse:
		out.Cmd = &tikvpb.BatchCommandsResponse_Response_BatchGet{BatchGet: r}
	case *kvrpcpb.ScanResponse:
		out.Cmd = &tikvpb.BatchCommandsResponse_Response_Scan{Scan: r}
	case *kvrpcpb.PrewriteResponse:
		out.Cmd = &tikvpb.BatchCommandsResponse_Response_Prewrite{Prewrite: r}
	case *kvrpcpb.CommitResponse:
		out.Cmd = &tikvpb.BatchCommandsResponse_Response_Commit{Commit: r}
	case *kvrpcpb.CleanupResponse:
		out.Cmd = &tikvpb.BatchCommandsResponse_Response_Cleanup{Cleanup: r}
	case *kvrpcpb.BatchRollbackResponse:
		out.Cmd = &tikvpb.BatchCommandsResponse_Response_BatchRollback{BatchRollback: r}
	case *kvrpcpb.ScanLockResponse:
		out.Cmd = &tikvpb.BatchCommandsResponse_Response_ScanLock{ScanLock: r}
	case *kvrpcpb.ResolveLockResponse:
		out.Cmd = &tikvpb.BatchCommandsResponse_Response_ResolveLock{ResolveLock: r}
	case *kvrpcpb.CheckTxnStatusResponse:
		out.Cmd = &tikvpb.BatchCommandsResponse_Response_CheckTxnStatus{CheckTxnStatus: r}
	case *kvrpcpb.CheckSecondaryLocksResponse:
		out.Cmd = &tikvpb.BatchCommandsResponse_Response_CheckSecondaryLocks{CheckSecondaryLocks: r}
	case *kvrpcpb.TxnHeartBeatResponse:
		out.Cmd = &tikvpb.BatchCommandsResponse_Response_TxnHeartBeat{TxnHeartBeat: r}
	default:
		return nil, status.Error(codes.Internal, fmt.Sprintf("tikvserve: the mock answered with a %T", r))
	}
	return out, nil
}

// GetStoreSafeTS answers client-go's periodic poll of every store's safe
// timestamp (for stale reads, which the adaptor does not use). The mock
// keeps no resolved timestamps, so the answer is 0, TiKV's "none known":
// no stale read is ever served from it.
func (t *tikvService) GetStoreSafeTS(context.Context, *kvrpcpb.StoreSafeTSRequest) (*kvrpcpb.StoreSafeTSResponse, error) {
	return &kvrpcpb.StoreSafeTSResponse{SafeTs: 0}, nil
}
