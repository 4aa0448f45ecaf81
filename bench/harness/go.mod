module github.com/engramkv/engram/bench/harness

go 1.26.8

require (
	github.com/engramkv/engram v0.0.0
	gonum.org/v1/plot v0.16.0
)

require (
	codeberg.org/go-fonts/liberation v0.5.0 // indirect
	codeberg.org/go-latex/latex v0.1.0 // indirect
	codeberg.org/go-pdf/fpdf v0.10.0 // indirect
	git.sr.ht/~sbinet/gg v0.6.0 // indirect
	github.com/ajstarks/svgo v0.0.0-20211024235047-1546f124cd8b // indirect
	github.com/campoy/embedmd v1.0.0 // indirect
	github.com/golang/freetype v0.0.0-20170609003504-e2365dfdc4a0 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	golang.org/x/image v0.25.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

// The harness reads engram bench's JSON with the schema in bench/result of
// this repository, never a published version. The engram module's own
// modules are unpublished too: replace directives are not inherited, so
// they are repeated here for the module graph to resolve.
replace (
	github.com/engramkv/engram => ../..
	github.com/engramkv/engram/internal/btree => ../../internal/btree
	github.com/engramkv/engram/wasm/abi => ../../wasm/abi
)
