package mvcc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// The import record (meta "import") marks a store whose import has not
// finished: it is written before anything else, carries the resume point,
// and Open refuses a store that holds it.

const metaImport = "import"

// ErrImportUnfinished is returned by Open for a store whose import (restore
// or migration) did not complete.
var ErrImportUnfinished = errors.New("mvcc: the store holds an unfinished import")

// ImportRecord is the durable state of an import, kept in meta "import"
// while it runs.
type ImportRecord struct {
	// Kind is "restore" or "migrate"; Source names what is imported (a file,
	// an endpoint).
	Kind   string `json:"kind"`
	Source string `json:"source"`
	// CompactRev is the compacted revision of the imported history.
	CompactRev int64 `json:"compact_rev"`
	// Applied is the last revision whose rows were all committed, 0 before
	// the first batch.
	Applied int64 `json:"applied"`
	// Extra is the caller's own resume state (a migration's source and
	// phase), stored and returned as is.
	Extra json.RawMessage `json:"extra,omitempty"`
}

// ReadImportRecord returns the store's unfinished import record, or nil.
func ReadImportRecord(ctx context.Context, s kv.Store) (*ImportRecord, error) {
	raw, err := s.Get(ctx, coder.MetaKey(metaImport))
	if errors.Is(err, kv.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, storageErr("read import record", err)
	}
	var r ImportRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("%w: import record: %v", errBadRecord, err)
	}
	return &r, nil
}

// checkImportRecord is Open's guard against serving a half-imported store.
func checkImportRecord(ctx context.Context, s kv.Store) error {
	r, err := ReadImportRecord(ctx, s)
	if err != nil {
		return err
	}
	if r != nil {
		return fmt.Errorf("%w: %s from %s stopped after revision %d; run it again to finish (or wipe the store)", ErrImportUnfinished, r.Kind, r.Source, r.Applied)
	}
	return nil
}
