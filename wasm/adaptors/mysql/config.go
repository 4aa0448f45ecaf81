package main

import (
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/engramkv/engram/wasm/adaptors/internal/sqlkv"
	"github.com/engramkv/engram/wasm/sdk"
)

// config is the plugin's configuration (storage.wasm.config): settings
// separated by white space, each KEY=VALUE. Besides table and pool-size
// (sqlkv.Config):
//
//	dsn=USER[:PASSWORD]@tcp(IP:PORT)/DATABASE[?PARAM=VALUE&...]
//	    required; a go-sql-driver/mysql DSN. IP:PORT must be listed in
//	    storage.wasm.allowed-addresses exactly as written here (there is
//	    no DNS inside the plugin, so use an IP address). Unknown params
//	    are session variables set on every connection.
//
// table=DATABASE.NAME names a table outside the DSN's database.
type config struct {
	sqlkv.Config
	dsn *mysql.Config
}

func parseConfig(raw []byte) (config, error) {
	var c config
	var err error
	c.Config, err = sqlkv.ParseConfig(raw, sqlkv.Dialect{MaxIdent: 64, Qualifier: "DATABASE"},
		sqlkv.Setting{Key: "dsn", Set: func(v string) error {
			d, err := mysql.ParseDSN(v)
			if err != nil {
				return err
			}
			if d.Net != "tcp" {
				return fmt.Errorf("network %q: only tcp(IP:PORT) reaches a server from inside the plugin", d.Net)
			}
			if d.DBName == "" {
				return fmt.Errorf("no database: want USER@tcp(IP:PORT)/DATABASE")
			}
			c.dsn = d
			return nil
		}})
	if err != nil {
		return c, err
	}
	if c.dsn == nil {
		return c, fmt.Errorf("%w: dsn=USER:PASSWORD@tcp(IP:PORT)/DATABASE is required", sdk.ErrInvalid)
	}
	return c, nil
}

// tableWhere selects the table in information_schema's views: by the
// schema it names, or the connection's default one.
func (c config) tableWhere() string {
	schema := "DATABASE()"
	if len(c.Table) == 2 {
		schema = "'" + c.Table[0] + "'" // sqlkv.ParseConfig admits no quote
	}
	return fmt.Sprintf(`TABLE_SCHEMA = %s AND TABLE_NAME = '%s'`, schema, c.Table[len(c.Table)-1])
}

// quotedTable is the table's name as SQL: each part in backquotes (the
// identifiers sqlkv.ParseConfig admits hold no backquote).
func (c config) quotedTable() string {
	q := make([]string, len(c.Table))
	for i, p := range c.Table {
		q[i] = "`" + p + "`"
	}
	return strings.Join(q, ".")
}
