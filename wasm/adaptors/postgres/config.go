package main

import (
	"fmt"

	"github.com/engramkv/engram/wasm/adaptors/internal/sqlkv"
	"github.com/engramkv/engram/wasm/sdk"
)

// config is the plugin's configuration (storage.wasm.config): settings
// separated by white space, each KEY=VALUE. Besides table and pool-size
// (sqlkv.Config):
//
//	url=postgres://USER[:PASSWORD]@IP:PORT/DATABASE?sslmode=disable
//	    required; a pgx connection URL. IP:PORT must be listed in
//	    storage.wasm.allowed-addresses exactly as written here (there is
//	    no DNS inside the plugin, so use an IP address). Percent-encode
//	    special characters in the password.
//
// table=SCHEMA.NAME names a table outside the search path.
type config struct {
	sqlkv.Config
	url string
}

func parseConfig(raw []byte) (config, error) {
	var c config
	var err error
	c.Config, err = sqlkv.ParseConfig(raw, sqlkv.Dialect{MaxIdent: 63, Qualifier: "SCHEMA"},
		sqlkv.Setting{Key: "url", Set: func(v string) error { c.url = v; return nil }})
	if err != nil {
		return c, err
	}
	if c.url == "" {
		return c, fmt.Errorf("%w: url=postgres://USER@IP:PORT/DATABASE is required", sdk.ErrInvalid)
	}
	return c, nil
}
