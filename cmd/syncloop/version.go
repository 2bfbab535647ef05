package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time: -ldflags "-X main.version=v0.1.0". A binary
// built without it reports its module version, or "dev".
var version = ""

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the syncloop version and what it was built with",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), versionString(version, readBuildInfo()))
			return err
		},
	}
}

// versionOrDev is this binary's version, for the User-Agent.
func versionOrDev() string { return resolveVersion(version, readBuildInfo()) }

// resolveVersion: the ldflags version, else the module version, else "dev".
func resolveVersion(ldflagsVersion string, bi *debug.BuildInfo) string {
	if ldflagsVersion != "" {
		return ldflagsVersion
	}
	if bi != nil && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

func readBuildInfo() *debug.BuildInfo {
	bi, _ := debug.ReadBuildInfo()
	return bi
}

// versionString formats "syncloop <version> (<go version>, client-go <v>)".
// The version comes from ldflags, else from the module build info.
func versionString(ldflagsVersion string, bi *debug.BuildInfo) string {
	clientGo := "unknown"
	if bi != nil {
		for _, d := range bi.Deps {
			if d.Path == "k8s.io/client-go" {
				clientGo = d.Version
			}
		}
	}
	return fmt.Sprintf("syncloop %s (%s, client-go %s)", resolveVersion(ldflagsVersion, bi), runtime.Version(), clientGo)
}
