package tikv

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tikv/client-go/v2/util/codec"
)

// regionStatsPath is PD's region statistics of a key range (tikv/pd
// server/api/stats.go, GetRegionStatus), under its API prefix.
const regionStatsPath = "/pd/api/v1/stats/region"

// pdAttemptTimeout bounds the request to one PD endpoint, so that one
// that accepts connections but does not answer (a hung or partitioned
// PD) leaves time for the next within Size's budget. PD answers from
// memory, in milliseconds.
const pdAttemptTimeout = 2 * time.Second

// mib is PD's unit of region sizes: TiKV reports bytes in its region
// heartbeats, PD keeps whole MiB (core.RegionFromHeartbeat).
const mib = 1 << 20

// pdRegionStats is the RegionStatsSource of a real cluster: PD's HTTP API,
// on the endpoints the PD client uses. Every PD member serves it (a
// follower forwards the request to the leader), so the endpoints are tried
// in turn, starting with the one that answered last.
type pdRegionStats struct {
	urls    []string // base URLs, scheme included, no trailing slash
	client  *http.Client
	attempt time.Duration // timeout of the request to one endpoint
	next    atomic.Int64  // index of the endpoint to try first
}

// newPDRegionStats returns the source on endpoints (host:port, or URLs as
// the PD client also accepts them). tlsConfig, when not nil, is the PD
// client's: PD serves its HTTP API with the same certificates as its gRPC,
// and endpoints without a scheme are then reached over https.
func newPDRegionStats(endpoints []string, tlsConfig *tls.Config) *pdRegionStats {
	scheme := "http://"
	transport := http.DefaultTransport.(*http.Transport).Clone()
	if tlsConfig != nil {
		scheme = "https://"
		transport.TLSClientConfig = tlsConfig
	}
	urls := make([]string, len(endpoints))
	for i, ep := range endpoints {
		ep = strings.TrimRight(strings.TrimSpace(ep), "/")
		if !strings.Contains(ep, "://") {
			ep = scheme + ep
		}
		urls[i] = ep
	}
	return &pdRegionStats{urls: urls, client: &http.Client{Transport: transport}, attempt: pdAttemptTimeout}
}

// pdRegionStatsJSON is the part of PD's answer (statistics.RegionStats)
// that Size uses.
type pdRegionStatsJSON struct {
	StorageSize int64 `json:"storage_size"` // MiB
	StorageKeys int64 `json:"storage_keys"`
}

// RegionStats asks PD for the statistics of the regions overlapping
// [start, end). PD keys its regions by TiKV's memcomparable encoding of
// the transactional keys (client-go's CodecPDClient decodes them for the
// region cache), so the bounds are sent encoded the same way; PD reads the
// query parameters as raw bytes.
func (p *pdRegionStats) RegionStats(ctx context.Context, start, end []byte) (RegionStats, error) {
	q := url.Values{
		"start_key": {string(codec.EncodeBytes(nil, start))},
		"end_key":   {string(codec.EncodeBytes(nil, end))},
	}
	first := int(p.next.Load())
	var errs []error
	for i := range p.urls {
		at := (first + i) % len(p.urls)
		actx, cancel := context.WithTimeout(ctx, p.attempt)
		st, err := p.get(actx, p.urls[at]+regionStatsPath+"?"+q.Encode())
		cancel()
		if err == nil {
			p.next.Store(int64(at))
			return st, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return RegionStats{}, fmt.Errorf("PD region statistics: %w", errors.Join(errs...))
}

// maxErrorBody bounds how much of an error answer goes into the error.
const maxErrorBody = 512

func (p *pdRegionStats) get(ctx context.Context, u string) (RegionStats, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return RegionStats{}, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return RegionStats{}, err // names the URL
	}
	defer resp.Body.Close()
	where := resp.Request.URL.Redacted()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		// PD answers errors with a JSON string ("TiKV cluster not
		// bootstrapped, ..."); show it unquoted when it is one.
		msg := strings.TrimSpace(string(body))
		var s string
		if json.Unmarshal(body, &s) == nil {
			msg = s
		}
		return RegionStats{}, fmt.Errorf("GET %s: %s: %s", where, resp.Status, msg)
	}
	var st pdRegionStatsJSON
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return RegionStats{}, fmt.Errorf("GET %s: decode the answer: %w", where, err)
	}
	if st.StorageSize < 0 || st.StorageKeys < 0 {
		return RegionStats{}, fmt.Errorf("GET %s: negative statistics %+v", where, st)
	}
	return RegionStats{Bytes: st.StorageSize * mib, Keys: st.StorageKeys}, nil
}
