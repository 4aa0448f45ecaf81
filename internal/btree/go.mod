module github.com/engramkv/engram/internal/btree

go 1.26.8
