package tikvserve

import (
	"context"
	"errors"
	"io"

	"github.com/pingcap/kvproto/pkg/pdpb"
	pd "github.com/tikv/pd/client"
)

// pdService is PD's gRPC service over the mock's PD client: the calls the
// PD client and client-go make (membership, timestamps, regions, stores,
// GC safe points). Region keys pass through unchanged: the mock keeps them
// in TiKV's encoding, as PD does, and the client decodes them.
type pdService struct {
	pdpb.UnimplementedPDServer
	s *Server
}

// member is the only PD member, which is its own leader.
func (p *pdService) member() *pdpb.Member {
	url := "http://" + p.s.pdAddr
	return &pdpb.Member{Name: "tikvserve-pd", MemberId: memberID, ClientUrls: []string{url}, PeerUrls: []string{url}}
}

func (p *pdService) header(ctx context.Context) *pdpb.ResponseHeader {
	return &pdpb.ResponseHeader{ClusterId: p.s.mock.PD.GetClusterID(ctx)}
}

// failed is a response header carrying err, as PD answers a request it
// cannot serve.
func (p *pdService) failed(ctx context.Context, err error) *pdpb.ResponseHeader {
	h := p.header(ctx)
	h.Error = &pdpb.Error{Type: pdpb.ErrorType_UNKNOWN, Message: err.Error()}
	return h
}

// outcome is the header of a response to a call that returned err: failed
// when it is not nil. The rest of a failed response is what the call
// returned with its error, which clients do not read.
func (p *pdService) outcome(ctx context.Context, err error) *pdpb.ResponseHeader {
	if err != nil {
		return p.failed(ctx, err)
	}
	return p.header(ctx)
}

func (p *pdService) GetMembers(ctx context.Context, _ *pdpb.GetMembersRequest) (*pdpb.GetMembersResponse, error) {
	m := p.member()
	return &pdpb.GetMembersResponse{Header: p.header(ctx), Members: []*pdpb.Member{m}, Leader: m, EtcdLeader: m}, nil
}

// Tso hands out timestamps from the fake's oracle, each request's Count of
// them at once.
func (p *pdService) Tso(stream pdpb.PD_TsoServer) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		physical, logical := p.s.tso.next(int64(req.GetCount()))
		err = stream.Send(&pdpb.TsoResponse{
			Header:    p.header(stream.Context()),
			Count:     req.GetCount(),
			Timestamp: &pdpb.Timestamp{Physical: physical, Logical: logical},
		})
		if err != nil {
			return err
		}
	}
}

func (p *pdService) GetRegion(ctx context.Context, req *pdpb.GetRegionRequest) (*pdpb.GetRegionResponse, error) {
	r, err := p.s.mock.PD.GetRegion(ctx, req.GetRegionKey(), bucketOpts(req.GetNeedBuckets())...)
	return p.regionResponse(ctx, r, err), nil
}

func (p *pdService) GetPrevRegion(ctx context.Context, req *pdpb.GetRegionRequest) (*pdpb.GetRegionResponse, error) {
	r, err := p.s.mock.PD.GetPrevRegion(ctx, req.GetRegionKey(), bucketOpts(req.GetNeedBuckets())...)
	return p.regionResponse(ctx, r, err), nil
}

func (p *pdService) GetRegionByID(ctx context.Context, req *pdpb.GetRegionByIDRequest) (*pdpb.GetRegionResponse, error) {
	r, err := p.s.mock.PD.GetRegionByID(ctx, req.GetRegionId(), bucketOpts(req.GetNeedBuckets())...)
	return p.regionResponse(ctx, r, err), nil
}

func bucketOpts(need bool) []pd.GetRegionOption {
	if need {
		return []pd.GetRegionOption{pd.WithBuckets()}
	}
	return nil
}

// regionResponse answers a region lookup; a key or ID no region holds is
// an answer without a region, as PD gives.
func (p *pdService) regionResponse(ctx context.Context, r *pd.Region, err error) *pdpb.GetRegionResponse {
	if err != nil {
		return &pdpb.GetRegionResponse{Header: p.failed(ctx, err)}
	}
	resp := &pdpb.GetRegionResponse{Header: p.header(ctx)}
	if r != nil && r.Meta != nil {
		resp.Region, resp.Leader, resp.Buckets = r.Meta, r.Leader, r.Buckets
	}
	return resp
}

func (p *pdService) ScanRegions(ctx context.Context, req *pdpb.ScanRegionsRequest) (*pdpb.ScanRegionsResponse, error) {
	regions, err := p.s.mock.PD.ScanRegions(ctx, req.GetStartKey(), req.GetEndKey(), int(req.GetLimit()))
	if err != nil {
		return &pdpb.ScanRegionsResponse{Header: p.failed(ctx, err)}, nil
	}
	resp := &pdpb.ScanRegionsResponse{Header: p.header(ctx)}
	for _, r := range regions {
		resp.Regions = append(resp.Regions, &pdpb.Region{Region: r.Meta, Leader: r.Leader})
		// Older clients read the two lists instead.
		resp.RegionMetas = append(resp.RegionMetas, r.Meta)
		resp.Leaders = append(resp.Leaders, r.Leader)
	}
	return resp, nil
}

func (p *pdService) GetStore(ctx context.Context, req *pdpb.GetStoreRequest) (*pdpb.GetStoreResponse, error) {
	st, err := p.s.mock.PD.GetStore(ctx, req.GetStoreId())
	return &pdpb.GetStoreResponse{Header: p.outcome(ctx, err), Store: st}, nil
}

func (p *pdService) GetAllStores(ctx context.Context, req *pdpb.GetAllStoresRequest) (*pdpb.GetAllStoresResponse, error) {
	var opts []pd.GetStoreOption
	if req.GetExcludeTombstoneStores() {
		opts = append(opts, pd.WithExcludeTombstone())
	}
	stores, err := p.s.mock.PD.GetAllStores(ctx, opts...)
	return &pdpb.GetAllStoresResponse{Header: p.outcome(ctx, err), Stores: stores}, nil
}

func (p *pdService) UpdateGCSafePoint(ctx context.Context, req *pdpb.UpdateGCSafePointRequest) (*pdpb.UpdateGCSafePointResponse, error) {
	sp, err := p.s.mock.PD.UpdateGCSafePoint(ctx, req.GetSafePoint())
	return &pdpb.UpdateGCSafePointResponse{Header: p.outcome(ctx, err), NewSafePoint: sp}, nil
}

func (p *pdService) UpdateServiceGCSafePoint(ctx context.Context, req *pdpb.UpdateServiceGCSafePointRequest) (*pdpb.UpdateServiceGCSafePointResponse, error) {
	min, err := p.s.mock.PD.UpdateServiceGCSafePoint(ctx, string(req.GetServiceId()), req.GetTTL(), req.GetSafePoint())
	if err != nil {
		return &pdpb.UpdateServiceGCSafePointResponse{Header: p.failed(ctx, err)}, nil
	}
	return &pdpb.UpdateServiceGCSafePointResponse{Header: p.header(ctx), ServiceId: req.GetServiceId(), TTL: req.GetTTL(), MinSafePoint: min}, nil
}
