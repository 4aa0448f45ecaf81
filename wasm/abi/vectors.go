package abi

// Vector is one golden test vector of testdata/vectors.json: an encoded
// message and what it means. The Go codec's tests and the SDK's tests check
// every vector, and so should other languages' implementations.
type Vector struct {
	Name      string `json:"name"`
	Op        string `json:"op"`
	Direction string `json:"direction"`
	Note      string `json:"note"`
	Hex       string `json:"hex"`
}

// VectorsPath is the vectors file's path relative to this module's root.
const VectorsPath = "testdata/vectors.json"
