package transfer

import (
	"context"
	"encoding/json"

	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/kv"
)

// The importer's writes of mvcc's import record (meta "import"), which
// keeps a half-done import from being served.

func (im *Importer) putRecord(ctx context.Context) error {
	return writeRecord(ctx, im.store, im.record)
}

// SetExtra replaces the import record's Extra, written with the next flush.
func (im *Importer) SetExtra(extra json.RawMessage) { im.record.Extra = extra }

// Unfinish puts an import record back on a store whose import finished but
// must not be served after all (a migration whose verification failed, or
// whose source moved on during the cut-over): Open refuses it again, and an
// importer resuming rec continues from rec.Applied.
func Unfinish(ctx context.Context, s kv.Store, rec mvcc.ImportRecord) error {
	return writeRecord(ctx, s, rec)
}

func writeRecord(ctx context.Context, s kv.Store, rec mvcc.ImportRecord) error {
	op, err := mvcc.ImportRecordOp(rec)
	if err != nil {
		return err
	}
	if err := s.Commit(ctx, []kv.Op{op}); err != nil {
		return mvcc.StorageError("write import record", err)
	}
	return nil
}
