package ec2api

import (
	"fmt"
	"regexp"
	"strings"
)

// apiError is an EC2 error answer. Codes and messages follow the EC2
// errors page (errors-overview.html) where it names one; not-found
// messages put the ID in single quotes as EC2 and moto do (aws-vpc-cni
// parses the ENI ID out of them).
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.code + ": " + e.msg }

func errorf(status int, code, format string, args ...any) *apiError {
	return &apiError{status: status, code: code, msg: fmt.Sprintf(format, args...)}
}

func invalidValue(format string, args ...any) *apiError {
	return errorf(400, "InvalidParameterValue", format, args...)
}

func errENINotFound(id string) *apiError {
	return errorf(400, "InvalidNetworkInterfaceID.NotFound", "The networkInterface ID '%s' does not exist", id)
}

func errAttachmentNotFound(id string) *apiError {
	return errorf(400, "InvalidAttachmentID.NotFound", "The network interface attachment ID '%s' does not exist", id)
}

func errInstanceNotFound(id string) *apiError {
	return errorf(400, "InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
}

func errSubnetNotFound(id string) *apiError {
	return errorf(400, "InvalidSubnetID.NotFound", "The subnet ID '%s' does not exist", id)
}

func errVPCNotFound(id string) *apiError {
	return errorf(400, "InvalidVpcID.NotFound", "The vpc ID '%s' does not exist", id)
}

// errGroupNotFound: the errors page lists both InvalidGroup.NotFound and
// InvalidSecurityGroupID.NotFound; which one an ENI call returns for an
// unknown group ID was not verified.
func errGroupNotFound(id string) *apiError {
	return errorf(400, "InvalidGroup.NotFound", "The security group '%s' does not exist", id)
}

func errInstanceType(names ...string) *apiError {
	return errorf(400, "InvalidInstanceType", "The following supplied instance types do not exist: [%s]", strings.Join(names, ", "))
}

// errInUse: an in-use ENI can be neither deleted nor attached again (the
// errors page; it adds that InvalidParameterValue may come instead).
func errInUse(id string) *apiError {
	return errorf(400, "InvalidNetworkInterface.InUse", "The network interface '%s' is currently in use.", id)
}

// errAddressInUse: the errors page has InvalidIPAddress.InUse ("The
// specified IP address is already in use") and Resource.AlreadyAssigned
// ("… already assigned to a resource"); which of the two EC2 returns here
// was not verified.
func errAddressInUse(a fmt.Stringer) *apiError {
	return errorf(400, "InvalidIPAddress.InUse", "Address %s is in use.", a)
}

func errDryRun() *apiError {
	return errorf(412, "DryRunOperation", "Request would have succeeded, but DryRun flag is set.")
}

// errThrottled: RequestLimitExceeded is a server error on the errors page
// (5xx); the Go SDK retries it by its code.
func errThrottled() *apiError {
	return errorf(503, "RequestLimitExceeded", "Request limit exceeded.")
}

// errDenied names the action plainly where EC2 puts an encoded
// authorization message.
func errDenied(action string) *apiError {
	return errorf(403, "UnauthorizedOperation", "You are not authorized to perform this operation. The caller may not call ec2:%s.", action)
}

var (
	eniIDShape        = regexp.MustCompile(`^eni-([0-9a-f]{8}|[0-9a-f]{17})$`)
	instanceIDShape   = regexp.MustCompile(`^i-([0-9a-f]{8}|[0-9a-f]{17})$`)
	attachmentIDShape = regexp.MustCompile(`^eni-attach-([0-9a-f]{8}|[0-9a-f]{17})$`)
)

// errMalformed answers an ID of the wrong shape, as the errors page's
// InvalidNetworkInterfaceId.Malformed (lower-case "Id") and its kin.
func errMalformed(code, id, want string) *apiError {
	return errorf(400, code, "Invalid id: %q (expecting %q)", id, want)
}
