// Package interopcheck holds no code: its test pins the keys of
// github.com/txlock/txlock/interop against the tools' own Go code, in a
// module of its own, so that those tools stay out of txlock's go.mod.
package interopcheck
