package aws

import (
	"context"
	"errors"
	"fmt"
	"strings"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"

	"github.com/vpcni/vpcni/internal/provider"
)

// EC2 error codes vpcni acts on (the EC2 API reference's error list, and
// for InsufficientCidrBlocks the EKS best-practices guide).
const (
	codeUnauthorized     = "UnauthorizedOperation"
	codeNoSubnetIPs      = "InsufficientFreeAddressesInSubnet"
	codeNoCIDRBlocks     = "InsufficientCidrBlocks"
	codeIPLimit          = "PrivateIpAddressLimitExceeded"
	codeAttachLimit      = "AttachmentLimitExceeded"
	codeENIQuota         = "NetworkInterfaceLimitExceeded"
	codeENINotFound      = "InvalidNetworkInterfaceID.NotFound"
	codeAttachNotFound   = "InvalidAttachmentID.NotFound"
	codeThrottled        = "RequestLimitExceeded"
	codeInUse            = "InvalidIPAddress.InUse"
	codeAlreadyAssigned  = "Resource.AlreadyAssigned"
	codeInvalidParameter = "InvalidParameterValue"
)

// errGone: the ENI is no longer there (InvalidNetworkInterfaceID.NotFound):
// deleted by someone, or by EC2 with its instance. What it held is gone.
var errGone = errors.New("the ENI no longer exists")

// code is the EC2 error code of err ("" if EC2 gave none).
func code(err error) string {
	var api smithy.APIError
	if errors.As(err, &api) {
		return api.ErrorCode()
	}
	return ""
}

// action is the EC2 action err came from ("" if none).
func action(err error) string {
	var op *smithy.OperationError
	if errors.As(err, &op) {
		return op.OperationName
	}
	return ""
}

// explain wraps an EC2 failure with what a person can do about it, and
// with the provider error the agent acts on: ErrExhausted for a limit or
// a full subnet, ErrTaken for an address held elsewhere, ErrUnavailable
// for throttling, EC2's own failures and no answer at all; errGone for an
// ENI that no longer exists.
func explain(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	c := code(err)
	switch c {
	case codeUnauthorized, "AccessDenied", "AccessDeniedException":
		act := action(err)
		if act == "" {
			act = "the action named above"
		}
		return fmt.Errorf("%w (the node's IAM role may not call ec2:%s: add it to the role's policy — vpcni's least policy is in docs/aws.md)", err, act)
	case "AuthFailure", "InvalidClientTokenId", "SignatureDoesNotMatch":
		return fmt.Errorf("%w (EC2 did not accept the credentials: check the instance profile, or the keys in the environment)", err)
	case codeNoSubnetIPs:
		return fmt.Errorf("%w (the subnet is full: add subnets with subnets/subnetTags, or free addresses in it): %w", err, provider.ErrExhausted)
	case codeNoCIDRBlocks:
		return fmt.Errorf("%w (no free aligned /28 in the subnet for a prefix: it is fragmented by single addresses; reserve room for prefixes with `aws ec2 create-subnet-cidr-reservation --subnet-id <subnet> --cidr <block> --reservation-type prefix`, or use a new subnet): %w", err, provider.ErrExhausted)
	case codeIPLimit:
		return fmt.Errorf("%w (the ENI holds as many addresses as its instance type allows): %w", err, provider.ErrExhausted)
	case codeAttachLimit:
		return fmt.Errorf("%w (the instance has as many ENIs as its type allows): %w", err, provider.ErrExhausted)
	case codeENIQuota:
		return fmt.Errorf("%w (the account's ENI quota for the region is used up: ask AWS for more, or lower maxENIs): %w", err, provider.ErrExhausted)
	case codeENINotFound:
		return fmt.Errorf("%w: %w", err, errGone)
	case codeInUse, codeAlreadyAssigned:
		return fmt.Errorf("%w: %w", err, provider.ErrTaken)
	case codeInvalidParameter:
		if m := strings.ToLower(err.Error()); strings.Contains(m, "in use") || strings.Contains(m, "already assigned") {
			return fmt.Errorf("%w: %w", err, provider.ErrTaken)
		}
		return err
	case codeThrottled, "InternalError", "ServiceUnavailable", "Unavailable", "InternalFailure":
		return fmt.Errorf("%w: %w", err, provider.ErrUnavailable)
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() < 500 && c != "" {
		return err // EC2 answered and said no: a client error
	}
	// A 5xx, or no usable answer at all (refused, reset, timed out, a
	// retry quota spent).
	return fmt.Errorf("%w: %w", err, provider.ErrUnavailable)
}

// isCode says whether err carries one of the EC2 error codes.
// refused says whether EC2 answered err with a client error (4xx): it
// refused the request and changed nothing. A server error (5xx) may come
// after EC2 acted.
func refused(err error) bool {
	var re *awshttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() >= 400 && re.HTTPStatusCode() < 500
}

func isCode(err error, codes ...string) bool {
	c := code(err)
	for _, want := range codes {
		if c == want {
			return true
		}
	}
	return false
}
