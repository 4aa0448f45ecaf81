package tikv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tikv/client-go/v2/config"
	tikvclient "github.com/tikv/client-go/v2/tikv"
	pd "github.com/tikv/pd/client"
)

// Open connects to the TiKV cluster whose PD servers are opts.PDEndpoints.
// ctx and opts.DialTimeout bound the connection to PD; the returned Store
// lives until Close.
//
// Everything is passed to client-go explicitly rather than through its
// process-wide configuration (config.GetGlobalConfig), so that two Stores
// in one process can use different clusters and certificates.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if len(opts.PDEndpoints) == 0 {
		return nil, errors.New("tikv: open: no PD endpoints")
	}
	for _, ep := range opts.PDEndpoints {
		if strings.TrimSpace(ep) == "" {
			return nil, errors.New("tikv: open: empty PD endpoint")
		}
	}
	if err := checkPrefix(opts.Prefix); err != nil {
		return nil, fmt.Errorf("tikv: open: %w", err)
	}
	if err := opts.TLS.validate(); err != nil {
		return nil, fmt.Errorf("tikv: open: %w", err)
	}
	// Route client-go's logs before the PD client logs its first line.
	routeClientLogs(baseLogger(opts))
	dial := opts.DialTimeout
	if dial <= 0 {
		dial = defaultDialTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, dial)
	defer cancel()

	security := config.NewSecurity(opts.TLS.CAFile, opts.TLS.CertFile, opts.TLS.KeyFile, nil)
	pdSecurity := pd.SecurityOption{CAPath: opts.TLS.CAFile, CertPath: opts.TLS.CertFile, KeyPath: opts.TLS.KeyFile}
	pdOpts := []pd.ClientOption{}
	if opts.RequestTimeout > 0 {
		// PD's per-request timeout (TSO, region lookups) defaults to 3s;
		// never let it exceed the budget of a whole call.
		pdOpts = append(pdOpts, pd.WithCustomTimeoutOption(min(opts.RequestTimeout, 3*time.Second)))
	}

	// The PD client's context is its lifetime, so it must not be ctx
	// (which ends when Open returns); ctx only aborts the initial
	// connection, through the AfterFunc.
	life, kill := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, kill)
	pdCli, err := pd.NewClientWithContext(life, opts.PDEndpoints, pdSecurity, pdOpts...)
	if !stop() {
		if err == nil {
			pdCli.Close()
		}
		kill()
		return nil, fmt.Errorf("tikv: open: connect to PD %v: %w", opts.PDEndpoints, ctx.Err())
	}
	if err != nil {
		kill()
		return nil, fmt.Errorf("tikv: open: connect to PD %v: %w", opts.PDEndpoints, err)
	}
	// Region metadata in PD holds keys in TiKV's memcomparable
	// encoding; the codec client decodes them for the region cache, as
	// client-go's own txnkv.NewClient does.
	codecPD := &tikvclient.CodecPDClient{Client: pdCli}

	tlsConfig, err := security.ToTLSConfig()
	if err != nil {
		pdCli.Close()
		kill()
		return nil, fmt.Errorf("tikv: open: TLS: %w", err)
	}
	// client-go reads the GC safe point from PD's embedded etcd.
	spkv, err := tikvclient.NewEtcdSafePointKV(opts.PDEndpoints, tlsConfig)
	if err != nil {
		pdCli.Close()
		kill()
		return nil, fmt.Errorf("tikv: open: connect to PD's etcd: %w", err)
	}
	uuid := fmt.Sprintf("tikv-%d", pdCli.GetClusterID(ctx))
	kvs, err := tikvclient.NewKVStore(uuid, codecPD, spkv, tikvclient.NewRPCClient(tikvclient.WithSecurity(security)))
	if err != nil {
		_ = spkv.Close()
		pdCli.Close()
		kill()
		return nil, fmt.Errorf("tikv: open: %w", err)
	}
	// From here kvs.Close closes the PD client and the safe point KV;
	// life only has to outlive them.
	var pdStats *pdRegionStats
	if opts.RegionStats == nil {
		pdStats = newPDRegionStats(opts.PDEndpoints, tlsConfig)
		opts.RegionStats = pdStats
	}
	s, err := New(kvs, opts)
	if err != nil {
		_ = kvs.Close()
		kill()
		return nil, err
	}
	s.onClose = func() {
		kill()
		if pdStats != nil {
			pdStats.client.CloseIdleConnections()
		}
	}
	// Fail now, not on the first request, if PD answers nothing.
	if _, err := s.timestamp(ctx); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("tikv: open: %w", err)
	}
	return s, nil
}
